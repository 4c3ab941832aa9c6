"""A sweep's runs, fitted once. The unit that varies is the run (a fresh process), so every figure comes from
runs, never from the windows of one: log throughput = combination + round + noise (a randomised block design,
the rounds as blocks: a shared machine's drift moves every row of a round alike).

- A row's level: its combination's effect in that two-way fit, at the average round, so a row stopped after
  round 2 is not ranked on round 2's machine while the others carry on in a slower one; the interval is a
  t-interval from the fit's residual spread (a description of where a run lands, not a claim: claims are
  pairs, judged by harness.verdict.rule).
- A pair: the per-round log ratios of the rounds both rows ran, judged by the rule with that pair's own spread
  (rows sharing no round are compared unpaired).
- A place in the round (the first run after the sweep's pause, the last): the rounds' orders balance it over
  the rows (harness.verdict.rounds); `place_effects` estimates it from the sweep (combination + round + place),
  so that the report can say when it is clear.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import numpy as np

from harness.verdict.rule import MIN_ROUNDS, Design, Judgement, paired, unpaired

CONFIDENCE = 0.95  # the levels' intervals (descriptions, not claims)


@dataclass(frozen=True)
class Observation:
    key: Hashable  # the row
    round: int | None  # None: not part of a round (a single run's repeats): never paired
    rate: float  # throughput, > 0
    place: int | None = None  # its place in the round (1: first), where known


@dataclass(frozen=True)
class PlaceEffect:
    """A run at `place` over a run at the round's average place, estimated from the whole sweep, with its 95 %
    interval (Bonferroni over the places)."""

    place: int
    ratio: float
    lo: float
    hi: float

    @property
    def clear(self) -> bool:
        return self.lo > 1 or self.hi < 1


@dataclass(frozen=True)
class Interval:
    point: float
    lo: float | None  # None: unknown (fewer runs than an interval needs)
    hi: float | None

    @property
    def known(self) -> bool:
        return self.lo is not None and self.hi is not None


def _t(df: float, confidence: float = CONFIDENCE) -> float:
    from scipy import stats  # here: Hydra imports the sweeper (and so this module) at every start

    return float(stats.t.ppf(0.5 + confidence / 2, df))


class Fit:
    """The sweep's quiet runs; `design` says how pairs are judged (by default: one look at the end, the
    family every pair of these rows)."""

    def __init__(self, observations: Iterable[Observation], design: Design | None = None) -> None:
        self.logs: dict[Hashable, list[tuple[int | None, float]]] = {}
        self.places: dict[tuple[Hashable, int], int] = {}  # (row, round) -> its run's place in the round
        for o in observations:
            if o.rate > 0 and math.isfinite(o.rate):
                self.logs.setdefault(o.key, []).append((o.round, math.log(o.rate)))
                if o.round is not None and o.place is not None:
                    self.places[(o.key, o.round)] = o.place
        self.design = design or Design(pairs=Design.family(len(self.logs)))
        self.effects, self.df_residual, self.s_residual = self._two_way()

    def _two_way(self) -> tuple[dict[Hashable, float], int, float | None]:
        """Least squares of log rate = combination + round; each combination's effect at the average round of
        the sweep, and the residual spread (None without degrees of freedom)."""
        keys = list(self.logs)
        cells = [(k, r, y) for k in keys for r, y in self.logs[k]]
        if not cells:
            return {}, 0, None
        blocks = sorted({r for _, r, _ in cells if r is not None})
        later = blocks[1:]  # the first round is the reference
        x = np.zeros((len(cells), len(keys) + len(later)))
        for i, (k, r, _) in enumerate(cells):
            x[i, keys.index(k)] = 1.0
            if r is not None and r in later:
                x[i, len(keys) + later.index(r)] = 1.0
        y = np.array([v for _, _, v in cells])
        beta, *_ = np.linalg.lstsq(x, y, rcond=None)
        rank = int(np.linalg.matrix_rank(x))
        average_round = float(np.sum(beta[len(keys):])) / len(blocks) if blocks else 0.0
        effects = {k: float(beta[i]) + average_round for i, k in enumerate(keys)}
        df = len(y) - rank
        if df <= 0:
            return effects, 0, None
        return effects, df, math.sqrt(float(np.sum((y - x @ beta) ** 2)) / df)

    def place_effects(self) -> list[PlaceEffect]:
        """Each place's effect, from the least-squares fit log rate = combination + round + place over the runs
        whose place is known, of the rows that took every place (sum-to-zero over the places); empty where the
        sweep cannot estimate it (one place, fewer than two such rows, or too few runs to leave two degrees of
        freedom)."""
        cells = [(k, r, y, self.places[(k, r)]) for k, runs in self.logs.items() for r, y in runs
                 if r is not None and (k, r) in self.places]
        places = sorted({p for *_, p in cells})
        # only rows that took every place: before the design has come round (fewer rounds than rows) a place is
        # tied to the few rows that held it, and their own spread would pass for the place's effect
        held: dict[Hashable, set[int]] = {}
        for k, _, _, p in cells:
            held.setdefault(k, set()).add(p)
        cells = [c for c in cells if held[c[0]] >= set(places)]
        if len(places) < 2 or len({k for k, *_ in cells}) < 2:
            return []
        keys = sorted({k for k, *_ in cells}, key=str)
        blocks = sorted({r for _, r, *_ in cells})
        columns = len(keys) + len(blocks) - 1 + len(places) - 1
        x = np.zeros((len(cells), columns))
        for i, (k, r, _, p) in enumerate(cells):
            x[i, keys.index(k)] = 1.0
            if blocks.index(r):
                x[i, len(keys) + blocks.index(r) - 1] = 1.0
            if places.index(p):
                x[i, len(keys) + len(blocks) - 1 + places.index(p) - 1] = 1.0
        y = np.array([v for _, _, v, _ in cells])
        rank = int(np.linalg.matrix_rank(x))
        df = len(y) - rank
        if rank < columns or df < 2:
            return []
        beta, *_ = np.linalg.lstsq(x, y, rcond=None)
        s2 = float(np.sum((y - x @ beta) ** 2)) / df
        cov = s2 * np.linalg.inv(x.T @ x)
        first = len(keys) + len(blocks) - 1
        # place p's effect against the average place: b_p - mean(b), with b_1 = 0
        contrast = np.zeros((len(places), columns))
        for i in range(len(places)):
            for j in range(1, len(places)):
                contrast[i, first + j - 1] = (1.0 if i == j else 0.0) - 1.0 / len(places)
        effects, variances = contrast @ beta, np.diag(contrast @ cov @ contrast.T)
        half = _t(df, 1 - (1 - CONFIDENCE) / len(places)) * np.sqrt(variances)
        return [PlaceEffect(p, math.exp(e), math.exp(e - h), math.exp(e + h))
                for p, e, h in zip(places, effects.tolist(), half.tolist(), strict=True)]

    def runs(self, key: Hashable) -> int:
        return len(self.logs.get(key, ()))

    def rounds(self, key: Hashable) -> set[int]:
        return {r for r, _ in self.logs.get(key, ()) if r is not None}

    def adjusted_log(self, key: Hashable) -> float:
        return self.effects[key]

    def ranked(self, keys: Iterable[Hashable]) -> list[Hashable]:
        """`keys` that have runs, fastest first by the round-adjusted level."""
        return sorted((k for k in keys if k in self.effects), key=lambda k: self.effects[k], reverse=True)

    def level(self, key: Hashable) -> Interval | None:
        """The row's throughput at the sweep's average round, with a 95 % interval from the fit's residual spread
        (None: the row has no run)."""
        if key not in self.effects:
            return None
        m = self.effects[key]
        if self.s_residual is None:
            return Interval(math.exp(m), None, None)
        half = _t(self.df_residual) * self.s_residual / math.sqrt(self.runs(key))
        return Interval(math.exp(m), math.exp(m - half), math.exp(m + half))

    def compare(self, a: Hashable, b: Hashable) -> Judgement | None:
        """a over b, judged by the rule: paired by the rounds both ran (at least two), else unpaired."""
        if a not in self.logs or b not in self.logs:
            return None
        ya = {r: y for r, y in self.logs[a] if r is not None}
        yb = {r: y for r, y in self.logs[b] if r is not None}
        common = sorted(set(ya) & set(yb))
        if len(common) >= MIN_ROUNDS or (common and not _unpaired_possible(self.logs[a], self.logs[b])):
            return paired([ya[r] - yb[r] for r in common], self.design)
        return unpaired([y for _, y in self.logs[a]], [y for _, y in self.logs[b]], self.design)


def _unpaired_possible(a: list[tuple[int | None, float]], b: list[tuple[int | None, float]]) -> bool:
    return len(a) >= 2 and len(b) >= 2
