"""The search's answer, as the report shows it first: the fastest configuration with its interval and its margin
over the runner-up (or the set that ties), the command line that trains with it, what was pruned and why, what
failed and why, and what the search cost beside what the grid would have. Decided by the verdict's one rule
(the report's standing); nothing here judges speed again."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

from harness.search.record import SearchRecord
from harness.verdict.racing import Standing
from harness.verdict.rule import interval_text

# overrides that belong to the search, not to the training run it recommends
NOT_FOR_TRAINING = ("search.", "sweep=", "round=", "place=", "after=", "repeat=", "hydra.", "timing.budget_s=")


@dataclass(frozen=True)
class SearchAnswer:
    sentence: str  # the answer in one sentence, first on every output
    best: str | None  # the row the answer recommends (the leader, decided or not); None: nothing ran
    decided: str | None  # winner, tie, alone, or None: the rule could not separate the top within the budget
    command: str | None  # the command that trains with the answer (None: nothing was decided)
    pruned: list[tuple[str, str]] = field(default_factory=list)  # (combination, reason)
    failed: list[tuple[str, str]] = field(default_factory=list)
    cost: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def markdown(self) -> list[str]:
        lines = ["## Search", "", f"**Answer:** {self.sentence}", ""]
        if self.command:
            lines += ["Train with it:", "", f"    {self.command}", ""]
        lines += [f"Cost: {self.cost}", ""]
        if self.pruned:
            lines += [f"Pruned by prediction ({len(self.pruned)}, not run):", "",
                      *[f"- {name}: {reason}" for name, reason in self.pruned], ""]
        if self.failed:
            lines += ["Failed, skipped or stopped:", "",
                      *[f"- {name}: {reason}" for name, reason in self.failed], ""]
        return lines


class Candidate(Protocol):
    """What the answer reads of a report's row (harness.report's Row is one; the search sits below the report)."""

    @property
    def label(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def throughput(self) -> float | None: ...

    @property
    def runs(self) -> int: ...

    @property
    def overrides(self) -> list[str]: ...


C = TypeVar("C", bound=Candidate)  # the rows answered from, handed back to `figure_of` as they are


def training_command(overrides: Sequence[str]) -> str:
    """`python run.py strategy=fsdp amp=O1 grad_accum=2`: the winner's settings as one training run."""
    kept = [o for o in overrides if not o.lstrip("+~").startswith(NOT_FOR_TRAINING)]
    return " ".join(["python run.py", *kept])


def answer(record: SearchRecord, rows: Sequence[C], state: Standing, margin: float,
           figure_of: Callable[[C], str]) -> SearchAnswer:
    """`figure_of(row)`: the row's throughput as the verdict words it (its unit, its interval)."""
    by_label = {r.label: r for r in rows}
    leader = by_label.get(str(state.leader)) if state.leader is not None else None
    failed = [(r.label, r.reason or r.status) for r in rows if r.status not in ("ok",) and not r.throughput]
    pruned = [(p.name, p.reason) for p in record.pruned]
    if leader is None:
        sentence = "no candidate measured a throughput on a quiet machine: nothing can be recommended"
    else:
        figure = figure_of(leader)
        if state.decided == "winner" and state.margin is not None:
            over = f"{state.margin.ratio:.2f}x{interval_text(state.margin.lo, state.margin.hi)} the runner-up " \
                   f"{state.runner_up}"
            sentence = f"{leader.label} is the fastest configuration found, {figure}, {over}"
        elif state.decided == "tie":
            sentence = (f"{leader.label} ({figure}) and {', '.join(map(str, state.tied))} are the fastest, "
                        f"equivalent within verdict.margin ({100 * margin:.0f} %): any of them")
        elif state.decided == "alone":
            sentence = f"{leader.label} ({figure}) is the only candidate left that ran"
        else:
            sentence = (f"{leader.label} leads ({figure}), but the rule could not separate it from "
                        f"{', '.join(map(str, state.open))} within the budget: any of them, or search again with "
                        "a larger search.budget_s")
    if record.ended_at is None:  # Ctrl-C, a scheduler's signal: what finished, said as partial
        sentence = f"interrupted before it ended; from what finished: {sentence}"
    command = training_command(leader.overrides) if leader is not None and leader.overrides else None
    return SearchAnswer(sentence, leader.label if leader is not None else None, state.decided, command, pruned, failed,
                        cost_words(record, sum(r.runs for r in rows)))


def cost_words(record: SearchRecord, started: int = 0) -> str:
    """`12 runs in 4.1 min (2 rounds); the grid: 36 combinations x 2 rounds = 72 runs, about 25 min at this
    search's pace`: the search's own cost beside the full grid's, at the search's mean time per run. `started`:
    the runs the report found, which is all an interrupted search can count (search.json counts whole rounds)."""
    if record.started_at is None or record.ended_at is None or not record.runs:
        runs = max(record.runs, started)
        return f"{runs} runs; interrupted before it ended (the answer is partial)" if runs else "no run finished"
    took = record.ended_at - record.started_at
    per_run = took / record.runs
    rounds = max(2, record.rounds)
    grid_runs = record.space * rounds
    return (f"{record.runs} runs in {_duration(took)} ({record.rounds} rounds, {record.ended_by}); the grid: "
            f"{record.space} combinations x {rounds} rounds = {grid_runs} runs, about {_duration(grid_runs * per_run)} "
            f"at this search's pace per run (the search took {100 * took / (grid_runs * per_run):.0f} % of it)")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
