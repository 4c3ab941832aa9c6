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

A look is counted by the sweep's round it is made after (racing's look after round r, whatever rounds a pair
missed to a busy run), never by a pair's paired rounds, so no interim level is spent twice; the report's look
is the last.

Three words, from the intervals alone:
- faster / slower: the look's (1 - level) interval excludes 1;
- equivalent: the (1 - 2 x level) interval lies within +-`margin` (verdict.margin: the smallest difference a
  user acts on): two one-sided tests at the look's level each (TOST), which is the same error rate as the
  faster/slower word's;
- undecided: neither; `Advice` then says how many rounds (a sweep of exactly that many, `repeat=N`) would tell
  a `margin` difference apart, and how many would show equal rows within the margin, each with 80 % power at
  the pair's spread: planned for the margin, never for the observed ratio."""

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
    (racing decided, or the budget ran out: the report's look there takes the last look's share); `look`: the
    round this look is made after (racing's), None for the last look (the report's)."""

    pairs: int = 1
    planned_rounds: int | None = None
    margin: float = 0.05
    alpha: float = ALPHA
    last_look: int | None = None
    look: int | None = None

    @property
    def pair_alpha(self) -> float:
        return self.alpha / max(1, self.pairs)

    def level(self, look: int | None = None) -> float:
        """The two-sided level of the look made after round `look` of the sweep (None: this design's look)."""
        from harness.verdict.sequential import FINAL_SHARE, interim_levels

        planned = self.planned_rounds
        if planned is None or planned <= MIN_ROUNDS:
            return self.pair_alpha
        look = self.look if look is None else look
        last = min(planned, self.last_look or planned)
        if look is None or look >= last:
            return FINAL_SHARE * self.pair_alpha
        return interim_levels(MIN_ROUNDS, planned, self.pair_alpha)[max(look, MIN_ROUNDS) - MIN_ROUNDS]

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
    def advice(self) -> Advice | None:
        """Undecided with a known spread: the rounds that would decide a pair this noisy (planned for the margin,
        not for the observed ratio); None when decided or when there is no spread to plan with."""
        if self.word != "undecided" or self.sd is None or self.design is None or not self.rounds:
            return None
        return advise(self.sd, self.design)


UNBOUNDED = 100.0  # an interval reaching past 100x (or 1/100x) says only that there are too few rounds yet


def interval_text(lo: float | None, hi: float | None, digits: int = 2) -> str:
    """` [0.95–1.22]`, or ` [unbounded yet]` where a strict level on a few rounds leaves it open."""
    if lo is None or hi is None:
        return ""
    if hi > UNBOUNDED or lo < 1 / UNBOUNDED:
        return " [unbounded yet]"
    return f" [{lo:.{digits}f}–{hi:.{digits}f}]"


def word(lo: float | None, hi: float | None, margin: float, within: tuple[float, float] | None = None) -> Word:
    """faster/slower from the (1 - level) interval [lo, hi]; equivalent from `within`, the (1 - 2 x level)
    interval (TOST; the same interval where not given)."""
    if lo is None or hi is None:
        return "undecided"
    if lo > 1:
        return "faster"
    if hi < 1:
        return "slower"
    eq_lo, eq_hi = within or (lo, hi)
    if eq_lo >= 1 / (1 + margin) and eq_hi <= 1 + margin:
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
    level = design.level()
    se = sd / math.sqrt(n)
    lo, hi = _exp(mean - _t(level, n - 1) * se), _exp(mean + _t(level, n - 1) * se)
    within = (_exp(mean - _t(2 * level, n - 1) * se), _exp(mean + _t(2 * level, n - 1) * se))
    return Judgement(math.exp(mean), lo, hi, n, sd, n - 1, level, word(lo, hi, design.margin, within), design)


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
    level = design.level()
    mean = ma - mb
    lo, hi = _exp(mean - _t(level, df) * se), _exp(mean + _t(level, df) * se)
    within = (_exp(mean - _t(2 * level, df) * se), _exp(mean + _t(2 * level, df) * se))
    return Judgement(math.exp(mean), lo, hi, 0, se, df, level, word(lo, hi, design.margin, within))


@dataclass(frozen=True)
class Advice:
    """What a sweep of exactly N rounds (one look, the same family) would decide for a pair with per-round log
    ratio SD `sd`, each with POWER: `tell` rounds to call a difference of the margin faster or slower, `within`
    rounds to show rows that are truly equal equivalent within the margin. MAX_ROUNDS_ADVISED + 1: no number up
    to it would (the noise itself says so). `tell_twice`: the rounds to tell twice the margin apart (what a
    user can still learn where the margin's own difference is out of reach)."""

    sd: float
    tell: int
    within: int
    tell_twice: int

    @property
    def rounds(self) -> int:
        """The rounds that decide it either way: the larger."""
        return max(self.tell, self.within)

    @property
    def possible(self) -> bool:
        return self.rounds <= MAX_ROUNDS_ADVISED


def advise(sd: float, design: Design) -> Advice | None:
    """The rounds a pair with this spread needs (planned for `design.margin` at the family's pair alpha, one
    look); None where the spread is unknown."""
    if not math.isfinite(sd):
        return None
    return Advice(sd, rounds_to_tell(sd, design.margin, design.pair_alpha),
                  rounds_to_show_within(sd, design.margin, design.pair_alpha),
                  rounds_to_tell(sd, (1 + design.margin) ** 2 - 1, design.pair_alpha))


@functools.lru_cache(maxsize=4096)
def rounds_to_tell(sd: float, margin: float, level: float) -> int:
    """The fewest rounds at which a true ratio of 1 + margin is called faster with POWER: the two-sided
    (1 - level) interval of the paired t excludes 1, by the noncentral t distribution."""
    from scipy.stats import nct

    if sd == 0:
        return MIN_ROUNDS
    effect = math.log(1 + margin)
    for n in range(MIN_ROUNDS, MAX_ROUNDS_ADVISED + 1):
        if float(nct.sf(_t(level, n - 1), n - 1, effect * math.sqrt(n) / sd)) >= POWER:
            return n
    return MAX_ROUNDS_ADVISED + 1


@functools.lru_cache(maxsize=4096)
def rounds_to_show_within(sd: float, margin: float, level: float) -> int:
    """The fewest rounds at which rows that are truly equal are called equivalent with POWER: the (1 - 2 x level)
    interval lies within +-margin, i.e. both one-sided tests at `level` pass (TOST). Each side fails with the
    noncentral t's probability; the power is at least one minus both (the union bound)."""
    from scipy.stats import nct

    if sd == 0:
        return MIN_ROUNDS
    bound = math.log(1 + margin)
    for n in range(MIN_ROUNDS, MAX_ROUNDS_ADVISED + 1):
        critical, shift = _t(2 * level, n - 1), math.sqrt(n) / sd
        if 1 - 2 * float(nct.cdf(critical, n - 1, bound * shift)) >= POWER:
            return n
    return MAX_ROUNDS_ADVISED + 1


def rounds_needed(mean: float, sd: float, design: Design) -> int | None:
    """The fewest rounds of a sweep of exactly that many (one look at the end, the same family) at which a pair
    whose true per-round log ratio is `mean`, with this spread, is called faster/slower with POWER (what a
    benchmark plans for a known effect; the verdict's advice plans for the margin: `advise`)."""
    if not math.isfinite(sd):
        return None
    return rounds_to_tell(sd, math.expm1(abs(mean)), design.pair_alpha)
