"""`rounds.json` in a sweep's folder: what the sweep set out to run and how far it got, written by the rounds
sweeper before each round and when it ends, read by the report. A run's own results.json cannot say what
never started, what the user typed for `repeat`, or that the sweep was interrupted: this file does."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.verdict.rounds import RoundsOutcome

NAME = "rounds.json"


@dataclass
class SweepRecord:
    combinations: list[list[str]]  # every combination of the sweep: its overrides
    names: list[str]  # ... as the log names them ("single O0 iterations=40")
    repeat: int | None  # as typed: exactly N rounds, or None (racing)
    budget_s: float
    margin: float
    command: str = ""  # the command line as typed, for advice to run it again
    planned: int | None = None  # racing: the design's maximum of rounds, fixed after the first
    rounds_started: int = 0
    busy_only: list[int] = field(default_factory=list)
    ended_by: str = ""  # empty while it runs (an interrupted sweep leaves it empty)
    orders: list[list[int]] = field(default_factory=list)  # each round's combinations in the order they ran
    round_seconds: list[float] = field(default_factory=list)  # each finished round's wall time
    stopped: dict[str, int] = field(default_factory=dict)  # racing: combination name -> the round it stopped after

    def update(self, outcome: RoundsOutcome) -> None:
        self.planned, self.rounds_started, self.ended_by = outcome.planned, outcome.started, outcome.ended_by
        self.busy_only, self.round_seconds = list(outcome.busy_only), list(outcome.round_seconds)
        self.orders = [list(order) for order in outcome.orders]
        self.stopped = {self.names[c]: number for c, number in outcome.stopped.items()}

    def write(self, folder: Path) -> None:
        path = folder / NAME
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self), indent=1))
        temporary.replace(path)

    def never_started(self, started: list[list[str]]) -> list[str]:
        """The names of the combinations no run started, given every started run's overrides."""
        ran = [set(o) for o in started]
        return [name for combination, name in zip(self.combinations, self.names, strict=True)
                if not any(set(combination) <= overrides for overrides in ran)]

    @property
    def interrupted(self) -> bool:
        return self.rounds_started > 0 and not self.ended_by


def read_sweep_record(folders: list[Path]) -> SweepRecord | None:
    """The plan of a report over exactly one sweep folder that has one (merged reports have none)."""
    plans = [folder / NAME for folder in folders if (folder / NAME).is_file()]
    if len(plans) != 1 or len(folders) != 1:
        return None
    try:
        return SweepRecord(**json.loads(plans[0].read_text()))
    except (OSError, ValueError, TypeError):
        return None
