"""Intervals from rounds. The unit that varies is the run (a fresh process), so every interval comes from runs,
never from the windows of one: log throughput = combination + round + noise (a randomised block design, the
rounds as blocks).

- A row's level: the geometric mean of its runs, with a t-interval from the spread of runs around their
  combination's mean, pooled over every combination of the sweep (a row with two runs has an interval as
  honest as the sweep's).
- A ratio between two rows: the mean over the rounds both ran of their log difference, with a t-interval
  from the residual spread once each round's shared shift (the machine's drift) is taken out; rows that
  share no round are compared unpaired.
- The minimum effect: how far one run of a combination strays from the combination's mean 95 % of the time
  (the sweep's own A/A noise); a ratio is a difference only when its interval excludes 1 *and* it exceeds this.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

CONFIDENCE = 0.95
MIN_EFFECT_FLOOR = 0.01  # no difference under 1 % is claimed, however quiet the machine

Judgement = Literal["faster", "slower", "same", "undecided"]


@dataclass(frozen=True)
class Observation:
    key: Hashable  # the row
    round: int | None  # None: not part of a round (a single run's repeats): never paired
    rate: float  # throughput, > 0


@dataclass(frozen=True)
class Interval:
    point: float
    lo: float | None  # None: unknown (fewer runs than an interval needs)
    hi: float | None

    @property
    def known(self) -> bool:
        return self.lo is not None and self.hi is not None


@dataclass(frozen=True)
class Ratio(Interval):
    paired_rounds: int = 0  # rounds the two rows both ran (0: compared unpaired)


def _t(df: int) -> float:
    from scipy import stats  # here: Hydra imports the sweeper (and so this module) at every start

    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, df))


class Fit:
    """The sweep's runs, fitted once; every interval the report and the racing use comes from here."""

    def __init__(self, observations: Iterable[Observation]) -> None:
        self.logs: dict[Hashable, list[tuple[int | None, float]]] = {}
        for o in observations:
            if o.rate > 0 and math.isfinite(o.rate):
                self.logs.setdefault(o.key, []).append((o.round, math.log(o.rate)))
        n = sum(len(v) for v in self.logs.values())
        within = sum((y - self.mean_log(k)) ** 2 for k, v in self.logs.items() for _, y in v)
        self.df_within = n - len(self.logs)
        self.s_within = math.sqrt(within / self.df_within) if self.df_within > 0 else None
        self.df_paired, self.s_paired = self._blocked()

    def _blocked(self) -> tuple[int, float | None]:
        """Residual spread of log rate = key + round (least squares over the runs there are)."""
        keys = list(self.logs)
        rows = [(k, r) for k in keys for r, _ in self.logs[k]]
        y = np.array([v for k in keys for _, v in self.logs[k]])
        blocks = sorted({r for _, r in rows if r is not None})
        if len(y) == 0:
            return 0, None
        x = np.zeros((len(rows), len(keys) + len(blocks)))
        for i, (k, r) in enumerate(rows):
            x[i, keys.index(k)] = 1.0
            if r is not None:
                x[i, len(keys) + blocks.index(r)] = 1.0
        rank = int(np.linalg.matrix_rank(x))
        df = len(y) - rank
        if df <= 0:
            return 0, None
        beta, *_ = np.linalg.lstsq(x, y, rcond=None)
        residual = float(np.sum((y - x @ beta) ** 2))
        return df, math.sqrt(residual / df)

    def runs(self, key: Hashable) -> int:
        return len(self.logs.get(key, ()))

    def rounds(self, key: Hashable) -> set[int]:
        return {r for r, _ in self.logs.get(key, ()) if r is not None}

    def mean_log(self, key: Hashable) -> float:
        values = [v for _, v in self.logs[key]]
        return sum(values) / len(values)

    def level(self, key: Hashable) -> Interval | None:
        """The row's throughput: geometric mean of its runs, 95 % interval (None: the row has no run)."""
        if key not in self.logs:
            return None
        m = self.mean_log(key)
        if self.s_within is None:
            return Interval(math.exp(m), None, None)
        half = _t(self.df_within) * self.s_within / math.sqrt(self.runs(key))
        return Interval(math.exp(m), math.exp(m - half), math.exp(m + half))

    def ratio(self, a: Hashable, b: Hashable) -> Ratio | None:
        """a's throughput over b's: paired by the rounds both ran, else unpaired."""
        if a not in self.logs or b not in self.logs:
            return None
        common = sorted(self.rounds(a) & self.rounds(b))
        if common and self.s_paired is not None:
            ya, yb = dict(self.logs[a]), dict(self.logs[b])
            d = sum(ya[r] - yb[r] for r in common) / len(common)
            half = _t(self.df_paired) * self.s_paired * math.sqrt(2 / len(common))
            return Ratio(math.exp(d), math.exp(d - half), math.exp(d + half), paired_rounds=len(common))
        d = self.mean_log(a) - self.mean_log(b)
        if self.s_within is None:
            return Ratio(math.exp(d), None, None)
        half = _t(self.df_within) * self.s_within * math.sqrt(1 / self.runs(a) + 1 / self.runs(b))
        return Ratio(math.exp(d), math.exp(d - half), math.exp(d + half))

    @property
    def min_effect(self) -> float | None:
        """How far one run strays from its combination's mean 95 % of the time (at least 1 %): a difference
        smaller than what separates identical runs is not claimed, however many rounds narrowed its interval."""
        if self.s_within is None:
            return None
        return max(MIN_EFFECT_FLOOR, math.exp(_t(self.df_within) * self.s_within) - 1)

    def judge(self, ratio: Ratio | None) -> Judgement:
        """faster/slower: the interval excludes 1 and the ratio is beyond the minimum effect; same: the whole
        interval lies within the minimum effect; otherwise more runs would tell."""
        effect = self.min_effect
        if ratio is None or not ratio.known or effect is None:
            return "undecided"
        assert ratio.lo is not None and ratio.hi is not None
        if ratio.lo > 1 and ratio.point > 1 + effect:
            return "faster"
        if ratio.hi < 1 and ratio.point < 1 / (1 + effect):
            return "slower"
        if ratio.lo >= 1 / (1 + effect) and ratio.hi <= 1 + effect:
            return "same"
        return "undecided"
