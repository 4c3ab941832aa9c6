"""harness/verdict/rule.py by hand: the paired interval at the design's level (checked against scipy's own
paired and Welch t-tests), the three words, Bonferroni over the pairs, alpha spent over a racing sweep's looks,
looks counted by the sweep's round, equivalence by two one-sided tests, and the rounds that would decide a pair
(checked by simulating them)."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from harness.verdict.rule import (
    MAX_ROUNDS_ADVISED,
    Design,
    advise,
    paired,
    rounds_needed,
    rounds_to_show_within,
    rounds_to_tell,
    unpaired,
    word,
)
from harness.verdict.sequential import FINAL_SHARE, interim_levels

# per-round log ratios a/b: mean 0.08, SD 0.02 over 3 rounds
DIFFS = [0.10, 0.06, 0.08]


def test_a_pair_is_judged_on_its_own_per_round_ratios():
    judged = paired(DIFFS, Design())
    # t(2) at 97.5 %: 4.3027; half-width 4.3027 x 0.02 / sqrt(3) = 0.04968
    assert (judged.rounds, judged.df, judged.level) == (3, 2, 0.05)
    assert judged.sd == pytest.approx(0.02)
    assert math.log(judged.ratio) == pytest.approx(0.08)
    assert (math.log(judged.lo), math.log(judged.hi)) == pytest.approx((0.030317, 0.129683), abs=1e-6)
    scipy_ci = stats.ttest_rel([1 + d for d in DIFFS], [1.0] * 3).confidence_interval(0.95)
    assert (math.log(judged.lo), math.log(judged.hi)) == pytest.approx((scipy_ci.low, scipy_ci.high))
    assert judged.word == "faster" and paired([-d for d in DIFFS], Design()).word == "slower"


def test_the_family_divides_alpha_bonferroni():
    """Ten pairs worded: each at 0.005; the same rounds no longer exclude 1."""
    judged = paired(DIFFS, Design(pairs=10))
    assert judged.level == pytest.approx(0.005)
    half = stats.t.isf(0.0025, 2) * 0.02 / math.sqrt(3)  # 14.089 x 0.01155 = 0.1627
    assert math.log(judged.lo) == pytest.approx(0.08 - half) and judged.word == "undecided"
    assert Design.family(12) == 66


def test_a_racing_sweep_spends_alpha_over_its_looks():
    design = Design(planned_rounds=10)
    levels = interim_levels(2, 10, 0.05)
    assert design.level(3) == pytest.approx(levels[1]) and design.level(10) == pytest.approx(FINAL_SHARE * 0.05)
    assert design.level(2) < 1e-6 and design.level(9) < 0.01  # almost nothing early; most of alpha at the end
    assert paired(DIFFS, Design(planned_rounds=10, look=3)).level == pytest.approx(levels[1])
    assert paired(DIFFS, design).level == pytest.approx(FINAL_SHARE * 0.05)  # no look given: the last (the report's)


def test_a_look_is_counted_by_the_sweeps_round_not_by_the_pairs_rounds():
    """Racing's look after round 5 of 10, where one row's round-4 run was busy: the pair has 4 paired rounds but
    is tested at look 5's level; counted by its paired rounds it would spend look 4's level a second time."""
    levels = interim_levels(2, 10, 0.05)
    judged = paired([0.10, 0.06, 0.08, 0.07], Design(planned_rounds=10, look=5))
    assert judged.rounds == 4 and judged.level == pytest.approx(levels[3]) and judged.level != pytest.approx(levels[2])


def test_equivalence_is_two_one_sided_tests_at_the_looks_level():
    """Per-round log ratios 0, 0.04, 0, 0.04: mean 0.02, SD sqrt(0.0016 / 3) = 0.02309, se 0.01155. The 95 % interval
    0.02 + 3.182 x 0.01155 = 0.0567 reaches 1.058 (past +5 %), but the 90 % interval 0.02 +- 2.353 x 0.01155 =
    [-0.0072, 0.0472] lies within log(1.05) = 0.0488: equivalent by TOST at 5 % a side, as the (1 - alpha) interval
    alone would not say."""
    diffs = [0.0, 0.04, 0.0, 0.04]
    judged = paired(diffs, Design())
    assert math.log(judged.hi) == pytest.approx(0.0567, abs=1e-4) and judged.hi > 1.05
    assert judged.word == "equivalent"
    assert paired([0.0, 0.06, 0.0, 0.06], Design()).word == "undecided"  # 0.03 + 2.353 x 0.0173 = 0.071: past it
    assert word(0.96, 1.06, 0.05, within=(0.97, 1.04)) == "equivalent" and word(0.96, 1.06, 0.05) == "undecided"


@pytest.mark.parametrize(("lo", "hi", "expected"), [
    (1.01, 1.20, "faster"), (0.80, 0.99, "slower"), (0.97, 1.04, "equivalent"), (1 / 1.05, 1.05, "equivalent"),
    (0.97, 1.06, "undecided"), (0.90, 1.10, "undecided"), (None, None, "undecided"),
    (1.01, 1.03, "faster"),  # excludes 1: faster, though by less than the margin
])
def test_the_three_words(lo, hi, expected):
    assert word(lo, hi, 0.05) == expected


def test_equivalent_within_the_margin():
    judged = paired([0.01, -0.01, 0.0, 0.005, -0.005], Design(margin=0.05))
    # SD sqrt(2.5e-4 / 4) = 0.0079; t(4) 2.7764: half 0.0098: [0.990, 1.010] within +-5 %
    assert judged.sd == pytest.approx(math.sqrt(2.5e-4 / 4)) and judged.word == "equivalent"
    assert paired([0.01, -0.01, 0.0, 0.005, -0.005], Design(margin=0.005)).word == "undecided"


def test_unpaired_is_welch_with_each_sides_own_spread():
    a, b = [1.0, 1.2, 1.1], [0.5, 0.8, 0.5]
    judged = unpaired(a, b, Design())
    expected = stats.ttest_ind(a, b, equal_var=False)
    ci = expected.confidence_interval(0.95)
    assert judged.df == pytest.approx(expected.df) and judged.df == pytest.approx(3.2)
    assert (math.log(judged.lo), math.log(judged.hi)) == pytest.approx((ci.low, ci.high))
    assert judged.rounds == 0 and judged.word == "faster"
    assert unpaired([1.0], b, Design()).word == "undecided" and not unpaired([1.0], b, Design()).known


def test_fewer_than_two_rounds_have_no_interval():
    one = paired([0.3], Design())
    assert not one.known and one.word == "undecided" and one.advice is None


def test_rounds_needed_shrink_with_the_effect_and_run_out_near_the_margin():
    design = Design(pairs=1)
    assert rounds_needed(math.log(1.20), 0.05, design) < rounds_needed(math.log(1.05), 0.05, design)
    assert rounds_needed(math.log(1.05), 0.10, design) > rounds_needed(math.log(1.05), 0.05, design)
    assert rounds_needed(math.log(1.05), 0.40, design) == MAX_ROUNDS_ADVISED + 1  # at the margin, very noisy
    assert rounds_needed(0.0, 0.0, design) == 2


def test_rounds_needed_deliver_the_power_they_promise_by_simulation():
    """A true 1.05 at a per-round SD of 7 % x sqrt(2): the rule asks for N rounds; 2,000 sweeps of exactly N
    rounds decide `faster` in about 80 % (the noncentral t), not far below."""
    sd, effect = 0.07 * math.sqrt(2), math.log(1.05)
    n = rounds_needed(effect, sd, Design())
    rng = random.Random(1)
    decided = sum(paired([rng.gauss(effect, sd) for _ in range(n)], Design()).word == "faster" for _ in range(2000))
    assert 0.77 <= decided / 2000 <= 0.87, (n, decided)
    fewer = sum(paired([rng.gauss(effect, sd) for _ in range(n // 2)], Design()).word == "faster" for _ in range(2000))
    assert fewer / 2000 < 0.65  # half the rounds: clearly less


def test_the_advice_is_planned_for_the_margin_never_for_the_observed_ratio():
    """Two undecided pairs with the same spread and different observed ratios get the same advice: the rounds to
    tell 5 % apart and to show equal rows within +-5 %, from the spread alone."""
    design = Design(pairs=3)
    near = paired([0.05, -0.03, 0.08, -0.06], design)
    far = paired([0.10, 0.02, 0.13, -0.01], design)  # the same deviations, shifted by 0.05
    assert near.word == far.word == "undecided" and near.sd == pytest.approx(far.sd)
    assert near.advice == far.advice and near.advice.tell == rounds_to_tell(near.sd, 0.05, 0.05 / 3)
    assert near.advice.within == rounds_to_show_within(near.sd, 0.05, 0.05 / 3)
    assert near.advice.rounds == max(near.advice.tell, near.advice.within) and near.advice.possible
    # 15 % noise a run (per-round SD 0.15 x sqrt 2): 5 % cannot be told apart in 100 rounds (about
    # (1.96 + 0.84)^2 x (0.212 / 0.0488)^2 = 148), but twice the margin, 1.1025, can: about 7.84 x (0.212 / 0.0976)^2 = 37
    # rounds plus the t's few more (the old advice, from an observed 1.10, said "no number up to 100" in 37 % of sweeps)
    noisy = advise(0.15 * math.sqrt(2), Design())
    assert noisy.tell > MAX_ROUNDS_ADVISED and 37 <= noisy.tell_twice <= 45
    assert not advise(0.40, Design(pairs=66)).possible  # only the noise itself says "cannot be told"


@pytest.mark.parametrize("what", ["tell", "within"])
def test_the_advice_delivers_the_power_it_promises_by_simulation(what):
    """At a per-round SD of 10 %: N rounds call a true 1.05 faster, and M rounds call equal rows equivalent, in
    about 80 % of 2,000 simulated sweeps of exactly that many rounds (not far below; TOST's union bound may
    overshoot)."""
    sd, design = 0.10, Design()
    advice = advise(sd, design)
    n, truth, expected = (advice.tell, math.log(1.05), "faster") if what == "tell" else (advice.within, 0.0, "equivalent")
    rng = random.Random(2)
    hits = sum(paired([rng.gauss(truth, sd) for _ in range(n)], design).word == expected for _ in range(2000))
    assert 0.77 <= hits / 2000 <= 0.90, (n, hits)
