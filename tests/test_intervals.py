"""harness/verdict/intervals.py by hand: levels from the round-adjusted (combination + round) fit, so a row stopped
before the machine slowed down is not ranked on its faster rounds; pairs judged on their own spread, paired by
round, or unpaired when they share no round."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from harness.verdict.intervals import Fit, Observation
from harness.verdict.rule import Design


def obs(key: str, logs: list[float], first_round: int = 1) -> list[Observation]:
    return [Observation(key, first_round + i, math.exp(x)) for i, x in enumerate(logs)]


def test_levels_are_round_adjusted_so_a_row_stopped_before_the_machine_slowed_does_not_lead():
    """A truly 1.0, B truly 0.85 (log -0.1625); the machine is 40 % slower (log -0.5) from round 3 on, and B ran
    rounds 1-2 only (racing stopped it). By raw means B would lead (-0.1625 > A's -0.25); adjusted, A leads by
    exactly 0.1625."""
    drift = [0.0, 0.0, -0.5, -0.5]
    a = [d + e for d, e in zip(drift, [0.01, -0.01, 0.01, -0.01], strict=True)]
    b = [-0.1625 + d + e for d, e in zip(drift[:2], [-0.01, 0.01], strict=True)]
    fit = Fit(obs("A", a) + obs("B", b))
    assert sum(b) / 2 > sum(a) / 4  # what the raw means say
    assert fit.ranked(["B", "A"]) == ["A", "B"]
    assert fit.adjusted_log("A") - fit.adjusted_log("B") == pytest.approx(0.1625, abs=1e-9)  # rounds 1-2: (0.1825 + 0.1425) / 2
    assert fit.level("A").point == pytest.approx(math.exp(fit.adjusted_log("A")))
    # the level sits at the sweep's average round: A's round effects average (0 + 0 - 0.5 - 0.5) / 4
    assert fit.adjusted_log("A") == pytest.approx(-0.25, abs=1e-9)


def test_a_levels_interval_comes_from_the_fits_residual_spread():
    """Two rows, three rounds each: residuals of the additive fit are +-(d - mean d) / 2 for the per-round
    differences d = 0.5, 0.4, 0.6: SS = 2 x (0.01 + 0 + 0.01) / 4 = 0.01 on 6 - 4 = 2 degrees of freedom."""
    fit = Fit(obs("A", [1.0, 1.2, 1.1]) + obs("B", [0.5, 0.8, 0.5]))
    assert fit.df_residual == 2 and fit.s_residual == pytest.approx(math.sqrt(0.005))
    level = fit.level("A")
    half = stats.t.ppf(0.975, 2) * math.sqrt(0.005) / math.sqrt(3)
    assert (math.log(level.lo), math.log(level.hi)) == pytest.approx((1.1 - half, 1.1 + half))


def test_a_pair_uses_its_own_spread_not_one_pooled_over_rows():
    """A and B are a noisy pair (their per-round ratios swing 10 %); C is quiet beside A. A vs B has the SD of
    A - B's rounds; A vs C the SD of A - C's: each pair's own."""
    a = [1.0, 1.0, 1.0, 1.0]
    b = [0.9, 1.1, 0.9, 1.1]
    c = [0.95, 0.951, 0.949, 0.95]
    fit = Fit(obs("A", a) + obs("B", b) + obs("C", c), Design(pairs=3))
    noisy, quiet = fit.compare("A", "B"), fit.compare("A", "C")
    assert noisy.sd == pytest.approx(stats.tstd([x - y for x, y in zip(a, b, strict=True)]))
    assert quiet.sd == pytest.approx(stats.tstd([x - y for x, y in zip(a, c, strict=True)]))
    assert quiet.word == "faster" and noisy.word == "undecided"
    assert noisy.rounds == quiet.rounds == 4 and noisy.level == pytest.approx(0.05 / 3)


def test_rows_sharing_no_round_are_compared_unpaired():
    fit = Fit(obs("A", [1.0, 1.2, 1.1]) + obs("B", [0.5, 0.8, 0.5], first_round=11))
    judged = fit.compare("A", "B")
    welch = stats.ttest_ind([1.0, 1.2, 1.1], [0.5, 0.8, 0.5], equal_var=False).confidence_interval(0.95)
    assert judged.rounds == 0 and (math.log(judged.lo), math.log(judged.hi)) == pytest.approx((welch.low, welch.high))


def test_runs_outside_rounds_are_never_paired_and_one_run_a_row_has_no_interval():
    fit = Fit([Observation("A", None, 100.0), Observation("A", None, 101.0), Observation("B", None, 50.0),
               Observation("B", None, 51.0)])
    assert fit.compare("A", "B").rounds == 0
    lone = Fit([Observation("A", 1, 100.0), Observation("B", 1, 50.0)])
    assert not lone.level("A").known and lone.compare("A", "B").word == "undecided"  # 2x, but how noisy?
    assert lone.compare("A", "missing") is None and lone.level("missing") is None


def test_the_default_family_is_every_pair_of_the_rows_fitted():
    fit = Fit(obs("A", [1.0, 1.1]) + obs("B", [1.0, 1.1]) + obs("C", [1.0, 1.1]) + obs("D", [1.0, 1.1]))
    assert fit.design.pairs == 6 and fit.design.planned_rounds is None


def test_the_place_effect_is_estimated_from_the_sweep_against_the_rounds_average_place():
    """3 rows in 6 rounds of the Williams orders, the first run of every round 5 % slower (log 0.95 = -0.0513), a
    round drift and a +-0.2 % wobble. Against the average of 3 places the first runs at exp(-0.0513 x 2/3) =
    0.9664x and the others at exp(0.0513 / 3) = 1.0173x; only the first is clearly off."""
    from harness.verdict.rounds import balanced_order

    found = []
    for number in range(1, 7):
        for place, key in enumerate(balanced_order([0, 1, 2], number - 1), start=1):
            wobble = 1 + 0.002 * math.sin(7 * number + 3 * key)
            rate = 100 * (1 + 0.04 * number) * (0.95 if place == 1 else 1.0) * wobble
            found.append(Observation(f"row{key}", number, rate, place))
    effects = {p.place: p for p in Fit(found).place_effects()}
    assert effects[1].ratio == pytest.approx(0.9664, abs=0.002) and effects[1].clear
    assert effects[2].ratio == pytest.approx(1.0173, abs=0.002) == effects[3].ratio
    assert Fit([Observation(o.key, o.round, o.rate) for o in found]).place_effects() == []  # places unknown
    # two rounds of three rows: no row has taken every place yet, so nothing is estimated
    assert Fit([o for o in found if o.round <= 2]).place_effects() == []
