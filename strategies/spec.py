"""What the parent reads of a strategy before anything starts: how its processes are laid out, which amp
levels it refuses, what it sends each iteration, and why it cannot run here. Class attributes and class
methods only: nothing here builds a model, a device or a process group, so the planner
(harness.launch.decide, harness.prediction) asks them of the class that conf/strategy/ names."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from harness.core.amp_levels import AmpSpec
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.errors import Incompatible

if TYPE_CHECKING:
    from torch import nn
from harness.core.traffic import Traffic


@dataclass(frozen=True)
class AmpRule:
    """One row of a strategy's compatibility with the amp levels as resolved (`AmpSpec`): where every
    attribute named in `when` has its value (or one of a tuple's), the run is refused before anything starts,
    naming `amp.<key>` and its value, and saying what is allowed (`{level}` and `{dtype}` filled in). The
    table of every strategy's rules is docs/strategies.md's (`python -m strategies.compat`)."""

    when: Mapping[str, Any]
    key: str
    allowed: str

    def matches(self, amp: AmpSpec) -> bool:
        return all(getattr(amp, name) in (value if isinstance(value, tuple) else (value,))
                   for name, value in self.when.items())


class StrategySpec(ABC):
    one_process_per_device: ClassVar[bool] = False  # True: the launcher starts a worker per device
    drives_all_devices: ClassVar[bool] = False  # True: one process uses every chosen GPU
    needs_cuda: ClassVar[bool] = False
    # Which of parameters, gradients and optimizer state each rank holds only 1/world_size of (theory).
    shards: ClassVar[tuple[bool, bool, bool]] = (False, False, False)
    amp_rules: ClassVar[tuple[AmpRule, ...]] = ()  # amp levels, implementations and dtypes it refuses
    # True: a value of `-m search=true`'s strategy axis (harness.search.space), a choice worth racing on any
    # machine; False (a strategy needing CUDA or an optional package, or kept for comparison) runs when named
    searchable: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """Required: what each iteration sends and what is held to send it (harness.prediction's predictions);
        `Traffic()` for a strategy that sends nothing."""

    @classmethod
    def shard_degree(cls, options: Mapping[str, Any], world_size: int) -> int:
        """The ranks that share one copy of what `shards` marks, each holding 1/degree of it: the world size, or
        with replicas of the sharded state (HSDP) one replica's ranks. What the memory theory and the planner
        divide by; read off the strategy's declared traffic (`Traffic.replicate`), so that both agree with it."""
        return cls.traffic(options).sharded_over(world_size)

    @classmethod
    def skip_reason(cls, placement: Placement, amp: AmpSpec) -> str | None:
        """Why this strategy has nothing to measure on this placement (recorded as `skipped`)."""
        if cls.needs_cuda and placement.accelerator != "cuda":
            return "needs CUDA GPUs; this machine has none (ran nothing)"
        return None

    @classmethod
    def check_compatible(cls, placement: Placement, amp: AmpSpec) -> None:
        """Raise Incompatible for an amp level this strategy would run wrongly: its first rule that matches."""
        for rule in cls.amp_rules:
            if rule.matches(amp):
                raise Incompatible(f"amp.{rule.key}", getattr(amp, rule.key),
                                   rule.allowed.format(level=amp.level, dtype=amp.dtype))

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        """The strategy's options (`cfg.strategy`, types already checked) against the rest of the run (compile,
        grad_accum, the global batch), before anything starts: ConfigError for a value its type allows but no
        run can use, Incompatible for one this machine, this torch or the run's other settings cannot honour
        (e.g. a communication backend it lacks). Nothing to check by default."""
        return None

    @classmethod
    def options_of(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options as a run of this strategy has them: those given, the constructor's defaults for the rest
        (a default lives once, in the signature; the parent's checks read it from there)."""
        params = inspect.signature(cls.__init__).parameters.values()
        defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        return {**defaults, **{k: v for k, v in options.items() if k != "_target_"}}

    @classmethod
    def variant(cls, options: Mapping[str, Any]) -> str:
        """The options that make this run a different combination from the strategy's plain one, for the
        report's label (e.g. `comm_hook=bf16`); empty when there are none."""
        return ""

    @classmethod
    def lossy(cls, options: Mapping[str, Any]) -> str | None:
        """Why these options make the update deliberately inexact (gradients sent in half precision, a low-rank
        approximation...), for numerical parity, which then reports the row's drift instead of judging it
        against float32 rounding; None when the options compute the exact update."""
        return None

    @classmethod
    def check_built(cls, cfg: RunConfig, placement: Placement, model: nn.Module) -> None:
        """Refuse, before launch, what only the model built on the meta device shows beside the world (a pipeline's
        blocks against its stages): raise ConfigError/Incompatible naming the key. Most strategies need nothing."""
        return None

    @classmethod
    def model_notes(cls, options: Mapping[str, Any], model: nn.Module) -> tuple[str, ...]:
        """What the run's notes should say about this model under these options, seen before launch on the model
        built on the meta device (e.g. FSDP2 finding no blocks to shard)."""
        return ()

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """A missing optional package: an error for a single run, a `skipped` row in a sweep."""
        return None
