"""harness.report.compare: two sweeps side by side, B over A per combination with an interval from the runs."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from test_report import results, write

from harness.report.command import main
from harness.report.compare import ratio, ratios


def test_the_ratio_is_of_geometric_means_and_its_interval_from_each_sides_runs_worked_by_hand():
    a, b = [100.0, 110.0, 90.0], [200.0, 220.0, 180.0]  # B is A doubled: the log difference is exactly log 2
    r = ratio("x", a, b)
    assert r.ratio == pytest.approx(2.0)
    s2 = statistics.variance([math.log(x) for x in a])  # the same for both sides: Welch's df is then 4
    half = 2.776 * math.sqrt(s2 * (1 / 3 + 1 / 3))  # t(0.975) on 4 degrees of freedom
    assert (r.low, r.high) == pytest.approx((2.0 * math.exp(-half), 2.0 * math.exp(half)), rel=1e-3)
    assert r.word == "faster"
    assert ratio("x", b, a).word == "slower"


def test_the_point_is_the_geometric_mean_ratio_and_a_wide_interval_is_no_verdict():
    r = ratio("x", [100.0, 100.0, 130.0], [100.0, 100.0, 100.0])
    assert r.ratio == pytest.approx(100 / (100 * 100 * 130) ** (1 / 3))  # not the medians' 1.0, not the means' 0.909
    assert r.low < 1 < r.high and r.word.startswith("undecided")


def test_a_small_difference_within_the_noise_of_its_runs_is_undecided_not_equivalent():
    """1.05x, but each side's runs stray by 6 %: the interval holds 1 (not faster) and reaches past +-5 % (not
    equivalent either)."""
    found = ratios({"x": ([100.0, 112.0, 100.0, 112.0], [106.0, 117.0, 106.0, 117.0])})[0]
    assert found.low < 1 < found.high and found.high > 1.05 and found.word.startswith("undecided")


def test_the_family_is_every_row_compared():
    """Three rows compared: each at 0.05 / 3, so the same runs give a wider interval than one row alone."""
    runs = ([100.0, 104.0, 98.0], [110.0, 112.0, 109.0])
    alone = ratios({"x": runs})[0]
    three = ratios({"x": runs, "y": runs, "z": runs})[0]
    assert three.level == pytest.approx(0.05 / 3) and alone.level == pytest.approx(0.05)
    assert three.low < alone.low and three.high > alone.high


def test_one_run_a_row_everywhere_gives_the_ratio_without_an_interval_or_a_word():
    r = ratio("x", [100.0], [120.0])
    assert r.ratio == pytest.approx(1.2) and r.low is None and r.word.startswith("unknown")
    beside = ratios({"x": ([100.0], [120.0]), "y": ([100.0, 104.0], [100.0, 98.0])})[0]
    assert beside.low is None  # another row's runs do not tell this row's spread


def _sweep(folder, torch_version, rates):
    for i, rate in enumerate(rates):
        data = results("single", "O0", ["cpu"], [1.0, 0.5], rate=rate)
        data["env"] = {"torch": torch_version, "python": "3.11.7", "cpu": "some CPU"}
        write(folder, f"{i}", data)


def test_two_sweeps_compared_name_what_differs_and_say_faster(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _sweep(a, "2.14.1+cu130", [100.0, 104.0, 98.0])
    _sweep(b, "2.15.0+cu132", [150.0, 149.0, 153.0])
    assert main(["--compare", str(a), str(b)]) == 0
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "torch: 2.14.1+cu130 → 2.15.0+cu132" in text and "python:" not in text
    line = next(x for x in text.splitlines() if "single O0" in x)
    assert "1.50×" in line and "runs 3/3" in line and line.rstrip().endswith("faster")
    assert not (tmp_path / "runs").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


@pytest.mark.parametrize("args, said", [
    (["one"], "one is not allowed: two sweeps' folders, A then B"),
    (["a", "other"], "is not allowed: two sweeps with a combination in common that ran in both"),
])
def test_bad_compares_are_one_line_and_exit_2(tmp_path, capsys, args, said):
    _sweep(tmp_path / "a", "2.15.0", [100.0])
    (tmp_path / "other").mkdir()
    other = results("single", "O0", ["cpu"], [1.0, 0.5], rate=100.0, batch=64)  # another batch: no common row
    write(tmp_path / "other", "0", other)
    (tmp_path / "one").mkdir()
    assert main(["--compare", *[str(tmp_path / x) for x in args]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert json.loads((tmp_path / "a" / "0" / "results.json").read_text())  # inputs untouched


def test_an_interval_past_100x_is_said_unbounded_not_printed(tmp_path, capsys):
    """A: 100 and 400 img/s, B: 100 and 100. Geometric means 200 and 100: 0.50x. Welch: B's runs do not vary, so
    df = 1 and the standard error is A's alone, ln 4 / 2 = 0.693; t(0.975, 1) = 12.706, half-width 8.81: the
    interval 0.5 * exp(-+8.81) = [7.5e-05, 3327] reaches past 1/100x and 100x."""
    r = ratio("x", [100.0, 400.0], [100.0, 100.0])
    assert r.ratio == pytest.approx(0.5)
    assert (r.low, r.high) == pytest.approx((0.5 * math.exp(-12.706 * math.log(4) / 2),
                                             0.5 * math.exp(12.706 * math.log(4) / 2)), rel=1e-3)
    a, b = tmp_path / "a", tmp_path / "b"
    _sweep(a, "2.15.0", [100.0, 400.0])
    _sweep(b, "2.15.0", [100.0, 100.0])
    assert main(["--compare", str(a), str(b)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "single O0" in x)
    assert "0.50× [unbounded yet]  runs 2/2" in line and "3327" not in line and "0.00" not in line


def test_a_row_with_no_run_on_one_side_gets_no_ratio_only_where_it_is_missing(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _sweep(a, "2.15.0", [100.0, 104.0, 98.0])
    _sweep(b, "2.15.0", [150.0, 149.0, 153.0])
    write(a, "ddp", results("ddp", "O0", ["cpu:0", "cpu:1"], [1.0, 0.5, 0.5], status="failed", error="rank 1: boom"))
    for i, rate in enumerate([200.0, 210.0, 190.0]):
        write(b, f"ddp{i}", results("ddp", "O0", ["cpu:0", "cpu:1"], [1.0, 0.5, 0.5], rate=rate))
    assert main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    ddp = next(x for x in out if "ddp O0" in x)
    assert ddp.split("ddp O0")[1].strip() == "only in B: no run in A" and "×" not in ddp
    assert "1.50×" in next(x for x in out if "single O0" in x)
    assert "over the 1 rows compared" in next(x for x in out if x.startswith("Per row"))
