"""The one rule every verdict word follows: racing's early stops, the report's winner, speedups against the
baseline, and `--compare` all ask `judge` and nothing else.

A pair of rows is judged on its own runs, paired by round: the per-round log ratio a/b (both ran in the same
round, so the machine's drift over the sweep cancels), its mean, and that pair's own standard deviation
(never one pooled over rows: a noisy pair would borrow quiet rows' confidence, a quiet pair noisy rows'
doubt). Rows that share no round (merged sweeps, two sweeps compared) are compared unpaired (Welch).

The interval's level keeps the sweep's family-wise error rate, any wrong word anywhere in the sweep, at
`ALPHA`: the sweep's alpha is divided over every pair the verdict may word (Bonferroni: k(k-1)/2 for k rows
judged), and a racing sweep's pair alpha is spent over its looks, planned for the sweep's rounds
(harness.verdict.sequential: most at the last look, the rest by an O'Brien-Fleming-type spending function over
the looks before); a sweep of exactly `repeat=N` rounds looks once, at the end, at the whole pair alpha.

Three words, from the interval alone:
- faster / slower: the interval excludes 1;
- equivalent: the interval lies within +-`margin` (verdict.margin: the smallest difference a user acts on);
- undecided: neither; `rounds_needed` then says how many rounds (a sweep of exactly that many, `repeat=N`)
  would decide it with 80 % power if the observed ratio and spread are the truth, or that no number up to
  `MAX_ROUNDS_ADVISED` would."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ALPHA = 0.05  # the sweep's family-wise false-claim rate
POWER = 0.80  # what `rounds_needed` plans for
MIN_ROUNDS = 2  # the first look: one run of each has no spread
MAX_ROUNDS_ADVISED = 100  # more rounds than this is not advice a user can take

Word = Literal["faster", "slower", "equivalent", "undecided"]


@dataclass(frozen=True)
class Design:
    """How a sweep's comparisons are judged. `pairs`: the family (every pair the verdict may word);
    `planned_rounds`: a racing sweep's plan (looks after every round from the second), None for one look at the
    end (`repeat=N`, `--compare`); `last_look`: the round of the last look, where it came before the plan's end
    (racing decided, or the budget ran out: the report's look there takes the last look's share)."""

    pairs: int = 1
    planned_rounds: int | None = None
    margin: float = 0.05
    alpha: float = ALPHA
    last_look: int | None = None

    @property
    def pair_alpha(self) -> float:
        return self.alpha / max(1, self.pairs)

    def level(self, rounds: int) -> float:
        """The two-sided level a look after `rounds` paired rounds tests at."""
        from harness.verdict.sequential import FINAL_SHARE, interim_levels

        planned = self.planned_rounds
        if planned is None or planned <= MIN_ROUNDS:
            return self.pair_alpha
        last = min(planned, self.last_look or planned)
        if rounds >= last:
            return FINAL_SHARE * self.pair_alpha
        return interim_levels(MIN_ROUNDS, planned, self.pair_alpha)[max(rounds, MIN_ROUNDS) - MIN_ROUNDS]

    @staticmethod
    def family(rows: int) -> int:
        return rows * (rows - 1) // 2


@dataclass(frozen=True)
class Judgement:
    """a over b: the ratio, its interval at the level the design gives this look, and the word."""

    ratio: float
    lo: float | None  # None: no interval (fewer than two paired rounds, or fewer than two runs a side)
    hi: float | None
    rounds: int  # paired rounds (0: compared unpaired)
    sd: float | None  # SD of the per-round log ratio (paired) or of the difference's estimate x sqrt(n) (Welch)
    df: float | None
    level: float | None  # the two-sided level of this look
    word: Word
    design: Design | None = None

    @property
    def known(self) -> bool:
        return self.lo is not None and self.hi is not None

    @property
    def rounds_needed(self) -> int | None:
        """Undecided and paired: the rounds that would decide it (> MAX_ROUNDS_ADVISED: none would); None when
        decided or when there is no spread to plan with."""
        if self.word != "undecided" or self.sd is None or self.design is None or not self.rounds:
            return None
        return rounds_needed(math.log(self.ratio), self.sd, self.design)


UNBOUNDED = 100.0  # an interval reaching past 100x (or 1/100x) says only that there are too few rounds yet


def interval_text(lo: float | None, hi: float | None, digits: int = 2) -> str:
    """` [0.95–1.22]`, or ` [unbounded yet]` where a strict level on a few rounds leaves it open."""
    if lo is None or hi is None:
        return ""
    if hi > UNBOUNDED or lo < 1 / UNBOUNDED:
        return " [unbounded yet]"
    return f" [{lo:.{digits}f}–{hi:.{digits}f}]"


def word(lo: float | None, hi: float | None, margin: float) -> Word:
    if lo is None or hi is None:
        return "undecided"
    if lo > 1:
        return "faster"
    if hi < 1:
        return "slower"
    if lo >= 1 / (1 + margin) and hi <= 1 + margin:
        return "equivalent"
    return "undecided"


def _exp(x: float) -> float:
    """exp, saturating: an interval so wide it reaches 0 or infinity (a t with one degree of freedom at a strict
    level) is said as such, not an overflow."""
    return math.exp(max(min(x, 700.0), -700.0))


@functools.lru_cache(maxsize=65536)
def _t(level: float, df: float) -> float:
    from scipy.stats import t

    return float(t.isf(level / 2, df))


def paired(log_ratios: Sequence[float], design: Design) -> Judgement:
    """a over b from the per-round log ratios of the rounds both ran."""
    n = len(log_ratios)
    mean = sum(log_ratios) / n if n else 0.0
    if n < MIN_ROUNDS:
        return Judgement(math.exp(mean), None, None, n, None, None, None, "undecided")
    sd = math.sqrt(sum((d - mean) ** 2 for d in log_ratios) / (n - 1))
    level = design.level(n)
    half = _t(level, n - 1) * sd / math.sqrt(n)
    lo, hi = _exp(mean - half), _exp(mean + half)
    return Judgement(math.exp(mean), lo, hi, n, sd, n - 1, level, word(lo, hi, design.margin), design)


def unpaired(a: Sequence[float], b: Sequence[float], design: Design) -> Judgement:
    """a over b from each row's own log rates, sharing no round: Welch's interval, one look."""
    if len(a) < 2 or len(b) < 2:
        mean = (sum(a) / len(a) - sum(b) / len(b)) if a and b else 0.0
        return Judgement(math.exp(mean), None, None, 0, None, None, None, "undecided")
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        df = float(len(a) + len(b) - 2)
    else:
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    level = design.pair_alpha
    half = _t(level, df) * se
    mean = ma - mb
    lo, hi = _exp(mean - half), _exp(mean + half)
    return Judgement(math.exp(mean), lo, hi, 0, se, df, level, word(lo, hi, design.margin))


@functools.lru_cache(maxsize=4096)
def rounds_needed(mean: float, sd: float, design: Design) -> int | None:
    """The fewest rounds of a sweep of exactly that many (one look at the end, the same family) at which a pair
    with this per-round log ratio and spread is decided with POWER, if they are the truth: its interval then
    excludes 1 (or lies within the margin) with that probability, by the noncentral t distribution of the
    paired t statistic. MAX_ROUNDS_ADVISED + 1 where no number up to it would; None where nothing is known."""
    from scipy.stats import nct

    if not math.isfinite(sd):
        return None
    if sd == 0:
        return MIN_ROUNDS
    bound = math.log(1 + design.margin)
    level = design.pair_alpha
    for n in range(MIN_ROUNDS, MAX_ROUNDS_ADVISED + 1):
        critical, shift = _t(level, n - 1), math.sqrt(n) / sd
        if float(nct.sf(critical, n - 1, abs(mean) * shift)) >= POWER:
            return n
        # within the margin: neither end of the interval reaches past it
        past = float(nct.cdf(critical, n - 1, (bound - abs(mean)) * shift)) + \
            float(nct.cdf(critical, n - 1, (bound + abs(mean)) * shift))
        if abs(mean) < bound and 1 - past >= POWER:
            return n
    return MAX_ROUNDS_ADVISED + 1
