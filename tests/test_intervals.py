"""harness/verdict/intervals.py by hand: geometric means, the pooled run-to-run spread, ratios paired by round
(and what an unpaired or window-based figure would have said instead), the minimum effect, the judgements."""

from __future__ import annotations

import math

import pytest

from harness.verdict.intervals import Fit, Observation, Ratio

T4, T2 = 2.7764451051977987, 4.302652729911275  # Student's t, 97.5 % quantile, 4 and 2 degrees of freedom

# log throughputs by round: A 1.0 1.2 1.1 (mean 1.1), B 0.5 0.8 0.5 (mean 0.6)
A, B = [1.0, 1.2, 1.1], [0.5, 0.8, 0.5]


def fit_of(a: list[float] = A, b: list[float] = B, rounds: bool = True) -> Fit:
    return Fit([Observation("A", i + 1 if rounds else None, math.exp(x)) for i, x in enumerate(a)]
               + [Observation("B", i + 1 if rounds else None, math.exp(x)) for i, x in enumerate(b)])


def test_a_rows_level_is_the_geometric_mean_of_its_runs_with_the_spread_pooled_over_rows():
    fit = fit_of()
    # within-row squares: A 0.01+0.01+0 = 0.02, B 0.01+0.04+0.01 = 0.06; 6 runs, 2 rows: s^2 = 0.08/4
    assert fit.df_within == 4 and fit.s_within == pytest.approx(math.sqrt(0.02))
    level = fit.level("A")
    assert level.point == pytest.approx(math.exp(1.1))  # not the arithmetic mean of the rates (3.0135...)
    assert level.point != pytest.approx(sum(math.exp(x) for x in A) / 3, rel=1e-4)
    half = T4 * math.sqrt(0.02) / math.sqrt(3)
    assert (level.lo, level.hi) == (pytest.approx(math.exp(1.1 - half)), pytest.approx(math.exp(1.1 + half)))


def test_a_ratio_pairs_the_runs_of_each_round_and_takes_the_rounds_shift_out():
    fit = fit_of()
    # differences by round 0.5 0.4 0.6: mean 0.5; key + round residuals: SS = sum((d - 0.5)^2) / 2 = 0.01 on
    # 6 - (2 + 3 - 1) = 2 degrees of freedom
    assert fit.df_paired == 2 and fit.s_paired == pytest.approx(math.sqrt(0.005))
    ratio = fit.ratio("A", "B")
    half = T2 * math.sqrt(0.005) * math.sqrt(2 / 3)
    assert ratio.paired_rounds == 3 and ratio.point == pytest.approx(math.exp(0.5))
    assert (ratio.lo, ratio.hi) == (pytest.approx(math.exp(0.5 - half)), pytest.approx(math.exp(0.5 + half)))
    inverse = fit.ratio("B", "A")
    assert inverse.point * ratio.point == pytest.approx(1) and inverse.lo * ratio.hi == pytest.approx(1)


def test_runs_outside_rounds_are_compared_unpaired():
    fit = fit_of(rounds=False)
    ratio = fit.ratio("A", "B")
    half = T4 * math.sqrt(0.02) * math.sqrt(1 / 3 + 1 / 3)
    assert ratio.paired_rounds == 0 and fit.s_paired == pytest.approx(fit.s_within)  # no round to take out
    assert (ratio.lo, ratio.hi) == (pytest.approx(math.exp(0.5 - half)), pytest.approx(math.exp(0.5 + half)))


def test_a_shared_drift_between_rounds_widens_the_levels_but_not_the_paired_ratio():
    """Round 2 runs 30 % faster for everyone (a machine's drift): each row's runs spread, the ratio does not."""
    drift = [0.0, math.log(1.3), 0.0]
    a = [1.0 + d for d in drift]
    b = [0.5 + d + e for d, e in zip(drift, [0.01, -0.01, 0.0], strict=True)]
    fit = fit_of(a, b)
    ratio = fit.ratio("A", "B")
    assert ratio.hi / ratio.lo < 1.1  # paired: the drift is gone
    level = fit.level("A")
    assert level.hi / level.lo > 1.3  # the level keeps it: a run next week may land anywhere in it


def test_one_run_per_row_has_no_interval():
    fit = Fit([Observation("A", 1, 100.0), Observation("B", 1, 50.0)])
    assert fit.s_within is None and not fit.level("A").known and fit.min_effect is None
    assert fit.judge(fit.ratio("A", "B")) == "undecided"  # 2x, but nothing says how noisy runs are


def test_a_row_with_one_run_still_gets_the_sweeps_pooled_interval():
    fit = Fit([Observation("A", 1, math.exp(1.0)), Observation("A", 2, math.exp(1.2)), Observation("B", 1, 50.0)])
    assert fit.df_within == 1 and fit.level("B").known


def test_the_minimum_effect_is_how_far_one_run_strays_from_its_mean_and_at_least_one_percent():
    assert fit_of().min_effect == pytest.approx(math.exp(T4 * math.sqrt(0.02)) - 1)  # 0.48
    tight = fit_of([1.0, 1.0001, 1.0], [0.5, 0.5, 0.5001])
    assert tight.min_effect == 0.01


@pytest.mark.parametrize(("point", "lo", "hi", "word"), [
    (1.20, 1.10, 1.30, "faster"),     # excludes 1 and beyond 5 %
    (1.04, 1.01, 1.07, "undecided"),  # excludes 1 but within 5 %: too small to claim, not proven equal
    (1.01, 0.99, 1.03, "same"),       # wholly within +-5 %
    (0.80, 0.70, 0.90, "slower"),
    (1.20, 0.90, 1.50, "undecided"),  # includes 1
])
def test_a_difference_needs_an_interval_excluding_one_and_an_effect_beyond_the_minimum(point, lo, hi, word):
    fit = fit_of()
    object.__setattr__(fit, "s_within", math.log(1.05) / T4)  # minimum effect 5 %
    assert fit.min_effect == pytest.approx(0.05)
    assert fit.judge(Ratio(point, lo, hi)) == word
