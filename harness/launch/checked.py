"""The combinations a command line describes, as the parent checked them before Hydra started: each one's
typed config and its `RunPlan` (or why it cannot run), kept for the jobs of this process.

`run.py` checks every combination first (harness.cli.precheck: composed, `RunConfig.from_dict`, `run_plan`,
predicted), then hands the command line to Hydra, which runs each job in this same process (its basic
launcher). A job finds its plan here by its overrides, so nothing is parsed, placed or resolved a second time.
A job started in another process (a submitit/SLURM job, a test calling the runner) finds nothing and decides
its own plan from the config it was given (`harness.launch.decide.plan_from_dict`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.core.config import RunConfig
from harness.core.errors import Incompatible
from harness.rank.run_plan import RunPlan

log = logging.getLogger(__name__)

SWEEP_SET = ("round", "place", "after")  # keys a sweep adds to a job's overrides: the same combination, another run


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


_CHECKED: dict[tuple[str, ...], Checked] = {}


def key_of(overrides: Iterable[str]) -> tuple[str, ...]:
    """The combination an override list names, whatever its order and whichever round it is: Hydra's own
    `hydra.*` overrides (a round's folder) and the sweep's `round=N place=P after=C` left out."""
    kept = (o for o in overrides if not o.startswith("hydra.") and o.partition("=")[0] not in SWEEP_SET)
    return tuple(sorted(kept))


def remember(overrides: Iterable[str], checked: Checked) -> None:
    _CHECKED[key_of(overrides)] = checked


def lookup(overrides: Iterable[str]) -> Checked | None:
    """The check made for a combination, as made (a search reads its prediction)."""
    return _CHECKED.get(key_of(overrides))


def forget_all() -> None:
    _CHECKED.clear()


def first() -> Checked | None:
    """The first combination checked (a sweep's settings for all its rounds: repeat, timing.budget_s, verdict)."""
    return next(iter(_CHECKED.values()), None)


def find(overrides: Iterable[str], composed: Mapping[str, Any]) -> Checked | None:
    """The check made for this job's combination, in its round; None when this process made none, or when
    what Hydra composed for the job differs from what was checked (then the job checks its own config)."""
    checked = _CHECKED.get(key_of(overrides))
    if checked is None:
        return None
    checked = checked.in_round(composed.get("round"), composed.get("place"), composed.get("after"))
    if dict(checked.resolved) != dict(composed):
        differing = sorted(k for k in {*checked.resolved, *composed} if checked.resolved.get(k) != composed.get(k))
        log.warning("the job's config differs from the one checked before the sweep (%s): checked again",
                    ", ".join(differing))
        return None
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
