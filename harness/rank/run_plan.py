"""What the parent decided about one combination, and what a rank is handed to run it.

`RunPlan` is built once in the parent (harness.launch.decide.run_plan) and read everywhere after: the
pre-flight checks, the runner, both launchers, `plan=true` and the report's projection. A rank receives it
inside a `RankSpec` (pickled by the launcher, or passed as is inline) and never re-reads a config dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from harness.core.amp_levels import AmpSpec
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.inputs import Inputs

if TYPE_CHECKING:
    from harness.prediction.predict import Prediction
    from strategies.base import Strategy


@dataclass(frozen=True)
class RunPlan:
    """One combination as it will run here: its checked config, where its ranks go, its amp level as resolved
    on this machine, and why it will not run (`skip`: nothing to measure on this placement; `unavailable`: an
    optional package is missing, an error for a single run and a skipped row in a sweep)."""

    config: RunConfig
    resolved: Mapping[str, Any]  # the config as composed, for results.json's `config` (never re-parsed)
    strategy_cls: type[Strategy]
    placement: Placement
    amp: AmpSpec
    launched: bool  # ranks run in child processes (False: inside the parent)
    inputs: Inputs  # what one sample is for this model (images, or token sequences)
    skip: str | None = None
    unavailable: str | None = None
    prediction: Prediction | None = None

    @property
    def will_run(self) -> bool:
        return self.skip is None and self.unavailable is None

    def skipped_because(self, in_sweep: bool = True) -> str | None:
        """The `skipped` row's reason, or None when it runs. A missing package counts only in a sweep (alone it
        is an error: harness.launch.runner.Unavailable)."""
        reason = self.skip or (self.unavailable if in_sweep else None)
        return f"strategy={self.config.strategy_name}: {reason}" if reason else None

    @property
    def label(self) -> str:
        return f"{self.config.strategy_name} {self.config.amp.level}"

    @property
    def device_ranks(self) -> int:
        """The devices' count a prediction is made for: one process driving every GPU (DataParallel) still
        puts a replica on each."""
        placement = self.placement
        if self.strategy_cls.drives_all_devices and placement.gpus:
            return len(placement.gpus)
        return placement.world_size

    def predicted(self, prediction: Prediction | None) -> RunPlan:
        return replace(self, prediction=prediction)


@dataclass(frozen=True)
class LauncherIdentity:
    """The process that started the ranks: a rank ends itself when it is gone (harness.core.stops)."""

    pid: int
    create_time: float


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs: the plan and where its outputs go."""

    plan: RunPlan
    record_dir: str
    parameters_path: str | None = None
    log_file: str | None = None
    repeat_label: str = ""
    launcher: LauncherIdentity | None = None  # set when the ranks are processes of their own
