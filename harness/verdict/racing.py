"""Racing: after each round (from the second, the first with a spread between processes), combinations clearly
slower than the leader stop; the rest get more rounds until the order at the top is decided or the budget is
spent. The report's verdict is the same standing, taken over every row at the end."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from harness.verdict.intervals import Fit, Ratio

MIN_ROUNDS = 2  # one run per combination has no spread between processes

Decided = Literal["winner", "tie", "alone"]


@dataclass(frozen=True)
class Standing:
    leader: Hashable | None
    runner_up: Hashable | None = None
    margin: Ratio | None = None  # leader over runner-up
    stopped: dict[Hashable, Ratio] = field(default_factory=dict)  # clearly slower: ratio to the leader
    tied: tuple[Hashable, ...] = ()  # with the leader, no difference beyond the minimum effect
    decided: Decided | None = None  # None: more rounds would tell


def standing(fit: Fit, contenders: Iterable[Hashable]) -> Standing:
    """The leader among `contenders` (highest geometric mean), who is clearly slower than it, and whether the
    top is decided: the leader beats the runner-up beyond noise (winner), or everyone left is within the
    minimum effect of it (tie), or it is the only one left (alone)."""
    ranked = sorted((k for k in contenders if fit.runs(k)), key=lambda k: fit.mean_log(k), reverse=True)
    if not ranked:
        return Standing(None)
    leader = ranked[0]
    stopped: dict[Hashable, Ratio] = {}
    left = [leader]
    for key in ranked[1:]:
        ratio = fit.ratio(key, leader)
        if ratio is not None and fit.judge(ratio) == "slower":
            stopped[key] = ratio
        else:
            left.append(key)
    if len(left) == 1:
        return Standing(leader, stopped=stopped, decided="alone" if not stopped else "winner",
                        runner_up=ranked[1] if len(ranked) > 1 else None,
                        margin=fit.ratio(leader, ranked[1]) if len(ranked) > 1 else None)
    # a runner-up still left is not clearly slower, so the leader cannot be a winner yet: a tie, or undecided
    runner_up = left[1]
    tied = tuple(k for k in left[1:] if fit.judge(fit.ratio(k, leader)) == "same")
    return Standing(leader, runner_up, fit.ratio(leader, runner_up), stopped, tied,
                    "tie" if len(tied) == len(left) - 1 else None)
