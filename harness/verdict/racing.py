"""The standing: who leads, who is slower than the leader, and whether the top is decided, all by the one rule
(harness.verdict.rule) on the round-adjusted fit. Racing asks it after each round from the second and stops
the rows it calls slower; the report asks it once more at the end, over every row."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from harness.verdict.intervals import Fit
from harness.verdict.rule import Judgement

Decided = Literal["winner", "tie", "alone"]


@dataclass(frozen=True)
class Standing:
    leader: Hashable | None
    runner_up: Hashable | None = None
    margin: Judgement | None = None  # leader over runner-up
    stopped: dict[Hashable, Judgement] = field(default_factory=dict)  # slower than the leader: row over leader
    tied: tuple[Hashable, ...] = ()  # equivalent to the leader within verdict.margin
    open: tuple[Hashable, ...] = ()  # neither: undecided against the leader
    decided: Decided | None = None  # None: more rounds would tell (or none would: see the judgements)


def standing(fit: Fit, contenders: Iterable[Hashable]) -> Standing:
    """The leader among `contenders` (highest round-adjusted level) and every other judged against it: the
    top is decided when all others are slower (winner) or slower or equivalent (tie), or when the leader is
    alone."""
    ranked = fit.ranked(contenders)
    if not ranked:
        return Standing(None)
    leader = ranked[0]
    if len(ranked) == 1:
        return Standing(leader, decided="alone")
    stopped: dict[Hashable, Judgement] = {}
    tied, open_ = [], []
    for key in ranked[1:]:
        judged = fit.compare(key, leader)
        if judged is not None and judged.word == "slower":
            stopped[key] = judged
        elif judged is not None and judged.word == "equivalent":
            tied.append(key)
        else:
            open_.append(key)
    runner_up = ranked[1]
    decided: Decided | None = None
    if not open_:
        decided = "tie" if tied else "winner"
    return Standing(leader, runner_up, fit.compare(leader, runner_up), stopped, tuple(tied), tuple(open_), decided)
