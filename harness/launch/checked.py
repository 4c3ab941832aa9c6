"""The combinations a command line describes, as the parent checked them before Hydra started: each one's
typed config and its `RunPlan` (or why it cannot run), kept for the sweep and the jobs of this process.

`run.py` checks every combination first (harness.cli.precheck: composed, `RunConfig.from_dict`, `run_plan`,
predicted), then hands the command line to Hydra, which runs each job in this same process (its basic
launcher). The rounds sweeper launches the combinations kept here, in the pre-check's order (`combinations`),
rather than expanding the grid again, and a job finds its plan here by its overrides (`find`), so nothing is
parsed, placed or resolved a second time. A job started in another process (a submitit/SLURM job, a test
calling the runner) finds nothing and decides its own plan from the config it was given
(`harness.launch.decide.plan_from_dict`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from harness.core.config import RunConfig
from harness.core.errors import Incompatible
from harness.rank.run_plan import RunPlan

SWEEP_SET = ("round", "place", "after")  # keys a sweep adds to a job's overrides: the same combination, another run
COMPARE_ENV = "HARNESS_COMPARE_COMPOSITION"  # set (a test): a job's composition must equal the one checked


@dataclass(frozen=True)
class Checked:
    """One combination: its checked config, and its plan or the reason it cannot run here (a sweep's
    `skipped` row)."""

    config: RunConfig
    resolved: Mapping[str, Any]  # the config as composed (Hydra's `hydra` node left out)
    plan: RunPlan | None = None
    refused: Incompatible | None = None

    def in_round(self, number: int | None, place: int | None = None, after: int | None = None) -> Checked:
        """The same combination as the sweep's round `number` runs it at `place`, after combination `after`:
        only those differ."""
        if (number, place, after) == (self.config.round, self.config.place, self.config.after):
            return self
        config = dataclasses.replace(self.config, round=number, place=place, after=after)
        given = {"round": number, "place": place, "after": after}  # a config composed without them has None
        resolved = {**self.resolved, **{k: v for k, v in given.items() if k in self.resolved or v is not None}}
        plan = dataclasses.replace(self.plan, config=config, resolved=resolved) if self.plan is not None else None
        return Checked(config=config, resolved=resolved, plan=plan, refused=self.refused)


class _Kept(NamedTuple):
    overrides: tuple[str, ...]  # the combination as the pre-check expanded it, in its order
    checked: Checked


_CHECKED: dict[tuple[str, ...], _Kept] = {}  # in the pre-check's order
_SWEEP: tuple[str, ...] | None = None  # the sweep's overrides (Hydra's task overrides) the combinations came from


def hydras_own(override: str) -> bool:
    """An override of Hydra's own (`hydra.*`, `hydra/launcher=...`): it sets up the sweep, not a combination, and
    Hydra hands its sweeper and its jobs' `hydra.overrides.task` only the others."""
    return override.lstrip("+~").startswith(("hydra.", "hydra/"))


def key_of(overrides: Iterable[str]) -> tuple[str, ...]:
    """The combination an override list names, whatever its order and whichever round it is: Hydra's own
    overrides (a round's folder, the launcher) and the sweep's `round=N place=P after=C` left out."""
    kept = (o for o in overrides if not hydras_own(o) and o.partition("=")[0] not in SWEEP_SET)
    return tuple(sorted(kept))


def remember(overrides: Iterable[str], checked: Checked) -> None:
    overrides = tuple(overrides)
    _CHECKED[key_of(overrides)] = _Kept(overrides, checked)


def remember_sweep(overrides: Sequence[str]) -> None:
    """The command line whose grid the remembered combinations are (its overrides as Hydra will get them): the
    rounds sweeper launches them only for a sweep of these overrides."""
    global _SWEEP
    _SWEEP = tuple(o for o in overrides if not hydras_own(o))


def lookup(overrides: Iterable[str]) -> Checked | None:
    """The check made for a combination, as made (a search reads its prediction)."""
    kept = _CHECKED.get(key_of(overrides))
    return kept.checked if kept is not None else None


def forget_all() -> None:
    global _SWEEP
    _CHECKED.clear()
    _SWEEP = None


def first() -> Checked | None:
    """The first combination checked (a sweep's settings for all its rounds: repeat, timing.budget_s, verdict)."""
    return next((kept.checked for kept in _CHECKED.values()), None)


def combinations(arguments: Sequence[str]) -> list[list[str]] | None:
    """The combinations the pre-check composed and checked for a sweep of `arguments` (Hydra's task overrides,
    as its sweeper gets them), in the pre-check's order (which is Hydra's grid order: the job numbers stay
    Hydra's), each without Hydra's own overrides, as Hydra's grid has them: what the rounds sweeper launches,
    so the grid is expanded once. None when this process checked no sweep of these overrides (a sweep started
    another way, or another command's left here): the sweeper then expands Hydra's grid itself."""
    if _SWEEP is None or tuple(arguments) != _SWEEP:
        return None
    return [[o for o in kept.overrides if not hydras_own(o)] for kept in _CHECKED.values()]


def find(overrides: Iterable[str], composed: Mapping[str, Any]) -> Checked | None:
    """The check made for this job's combination, in its round (read from `composed`); None when this process
    made none (the job then checks its own config).

    Found by its overrides alone: the sweeper launches the very combinations checked, and this process composes
    a combination the same way each time (the same conf/ parsed once, the same resolvers), so what Hydra composed
    for the job's `.hydra/` and folder name is not checked again. Were conf/ edited during a sweep, later rounds
    still run what was checked (results.json's `config` says so) while `.hydra/config.yaml` shows the edit.
    With HARNESS_COMPARE_COMPOSITION set (a test), a job whose composition differs raises."""
    kept = _CHECKED.get(key_of(overrides))
    if kept is None:
        return None
    checked = kept.checked.in_round(composed.get("round"), composed.get("place"), composed.get("after"))
    if os.environ.get(COMPARE_ENV) and dict(checked.resolved) != dict(composed):
        differing = sorted(k for k in {*checked.resolved, *composed} if checked.resolved.get(k) != composed.get(k))
        raise AssertionError(f"the job's config differs from the one checked before the sweep: {', '.join(differing)}")
    return checked


def sweep_settings(sweep_config: Any) -> RunConfig:
    """What a sweep's rounds read (repeat, timing.budget_s, verdict.margin: one value for the whole sweep,
    harness.cli.check_round_keys), typed: the first combination's checked config, or, for a sweep this process
    did not check, the sweep's own config checked here."""
    known = first()
    if known is not None:
        return known.config
    from omegaconf import OmegaConf, open_dict

    config = sweep_config.copy()
    strategy = str(config.hydra.runtime.choices.get("strategy"))
    with open_dict(config):
        del config["hydra"]
    return RunConfig.from_dict(OmegaConf.to_container(config, resolve=True), strategy)  # type: ignore[arg-type]
