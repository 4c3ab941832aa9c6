"""The side-by-side report against results files whose figures are worked out by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness import report
from harness.memory.report import DeviceUse


def results(strategy, amp, devices, window_seconds, *, batch=32, status="ok", error=None, rate=None,
            peaks=None, pids=None, loss=2.0, every=20):
    cumulative, windows = 0.0, []
    for i, seconds in enumerate(window_seconds):
        cumulative += seconds
        windows.append({"end_iter": every * (i + 1), "seconds": seconds, "cumulative_seconds": cumulative,
                        "warmup": i == 0, "loss": loss - 0.1 * i})
    peaks = peaks or [1000.0] * len(devices)
    pids = pids or [100 + i for i in range(len(devices))]
    return {"schema": 1, "status": status, "error": error, "strategy": strategy, "amp": amp, "model": "resnet18",
            "devices": devices, "world_size": len(set(pids)), "global_batch": batch, "image_size": 32,
            "iterations": every * len(window_seconds), "log_every": every, "launcher": "elastic/spawn",
            "precision": {"impl": "native", "dtype": "float32"}, "windows": windows if status == "ok" else [],
            "throughput_img_s": rate, "startup_seconds": 2.0,
            "ranks": [{"rank": i, "device": d} for i, d in enumerate(devices)],
            "memory": {"source": "psutil",
                       "per_device": [{"device": d, "peak_mib": p, "baseline_mib": 100.0} for d, p in zip(devices, peaks, strict=True)],
                       "per_process": [{"pid": pid, "rank": i, "device": d, "peak_mib": 1.0, "role": "rank"}
                                       for i, (d, pid) in enumerate(zip(devices, pids, strict=True))]}}


def write(folder: Path, name: str, data: dict) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "results.json").write_text(json.dumps(data))


@pytest.fixture
def sweep(tmp_path):
    # single O0: steady windows 1.0, 1.2, 0.8, 1.0 s -> 640 img/s (32*20*4/4.0)
    write(tmp_path, "0_single_O0", results("single", "O0", ["cpu"], [2.0, 1.0, 1.2, 0.8, 1.0], rate=640.0))
    # ddp O0 on 2 devices: steady 0.5 s each -> 1280 img/s; used memory 1000 and 800 MiB
    write(tmp_path, "1_ddp_O0", results("ddp", "O0", ["cpu:0", "cpu:1"], [1.0, 0.5, 0.5, 0.5, 0.5], rate=1280.0,
                                        peaks=[1100.0, 900.0]))
    write(tmp_path, "2_dp_O0", results("dp", "O0", ["cpu"], [], status="skipped",
                                       error="strategy=dp: needs two or more CUDA GPUs"))
    write(tmp_path, "3_ddp_O1", results("ddp", "O1", ["cpu:0", "cpu:1"], [], status="failed",
                                        error="rank 1 (pid 7): RuntimeError: boom"))
    return tmp_path


def test_figures_worked_by_hand(sweep):
    found, skipped = report.find_results([sweep])
    rows, baseline = report.build_rows(found)
    by = {r.label: r for r in rows}
    assert skipped == [] and baseline == "single O0"
    single, ddp = by["single O0"], by["ddp O0"]
    assert single.s_per_20 == pytest.approx(1.0)
    assert single.s_per_20_p10 == pytest.approx(0.86) and single.s_per_20_p90 == pytest.approx(1.14)
    assert single.cumulative == [(20, 2.0), (40, 3.0), (60, 4.2), (80, 5.0), (100, 6.0)]
    assert ddp.speedup == pytest.approx(2.0) and ddp.efficiency == pytest.approx(1.0)
    assert single.speedup == pytest.approx(1.0) and single.efficiency is None  # one device: nothing scaled
    assert (ddp.memory.max_mib, ddp.memory.min_mib) == (1000.0, 800.0)
    assert ddp.memory.imbalance_pct == pytest.approx(25.0)  # (1000 - 800) / 800
    assert ddp.processes == 2 and single.processes == 1
    assert single.final_loss == pytest.approx(1.6)
    # 2x apart, but one run each: nothing says how far runs of one combination scatter
    assert "throughput" not in report.decide(rows).winners and not ddp.spread_known and ddp.speedup_lo is None


def test_failed_and_skipped_rows_keep_their_reason(sweep):
    rows, _ = report.build_rows(report.find_results([sweep])[0])
    by = {r.label: r for r in rows}
    assert by["dp O0"].status == "skipped" and "CUDA" in by["dp O0"].reason
    assert by["ddp O1"].status == "failed" and "rank 1" in by["ddp O1"].reason
    assert by["ddp O1"].throughput is None and by["ddp O1"].speedup is None
    md = report.to_markdown(report.of_rows(rows, "single O0"))
    assert "skipped: strategy=dp: needs two or more CUDA GPUs" in md
    assert "failed: rank 1 (pid 7): RuntimeError: boom" in md


def test_repeats_become_a_geometric_mean_with_an_interval_from_the_runs(tmp_path):
    """Rates 100, 120, 110: geometric mean 109.70 (median 110, mean 110); 95 % interval on the log scale with
    t(2) = 4.303 and the runs' own SD (the min-max 100-120 or the windows' spread would be other numbers)."""
    import math
    import statistics

    for i, rate in enumerate([100.0, 120.0, 110.0]):
        write(tmp_path, f"r{i}", results("ddp", "O2", ["cpu:0", "cpu:1"], [1.0, 0.5], rate=rate))
    rows, _ = report.build_rows(report.find_results([tmp_path])[0])
    assert len(rows) == 1 and rows[0].runs == 3
    logs = [math.log(x) for x in (100.0, 120.0, 110.0)]
    half = 4.302652729911275 * statistics.stdev(logs) / math.sqrt(3)
    row = rows[0]
    assert row.throughput == pytest.approx((100.0 * 120.0 * 110.0) ** (1 / 3))
    assert row.throughput_lo == pytest.approx(math.exp(statistics.fmean(logs) - half))
    assert row.throughput_hi == pytest.approx(math.exp(statistics.fmean(logs) + half))
    assert 80 < row.throughput_lo < 100 and 120 < row.throughput_hi < 150


def test_differences_within_the_spread_are_not_wins(tmp_path):
    for i, rate in enumerate([100.0, 130.0]):
        write(tmp_path, f"a{i}", results("single", "O0", ["cpu"], [1.0, 0.5], rate=rate))
    for i, rate in enumerate([110.0, 140.0]):
        write(tmp_path, f"b{i}", results("ddp", "O0", ["cpu:0", "cpu:1"], [1.0, 0.5], rate=rate))
    rows, _ = report.build_rows(report.find_results([tmp_path])[0])
    assert "throughput" not in report.decide(rows).winners  # 125 vs 115, ranges 110-140 and 100-130 overlap


def test_report_files_plots_and_index(sweep):
    out = report.build_report([sweep], sweep, quiet=True)
    for name in ("report.md", "report.csv", "report.json", "index.html"):
        assert (sweep / name).is_file()
    pngs = sorted(p.name for p in sweep.glob("*.png"))
    assert len(pngs) >= 3 and all((sweep / p).stat().st_size > 1000 for p in pngs)
    html = (sweep / "index.html").read_text()
    import base64

    embedded = [base64.b64decode(data) for data in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]
    assert sorted(embedded) == sorted((sweep / p).read_bytes() for p in pngs)  # every plot inside the page
    assert not re.findall(r'src="(?!data:)', html)  # and nothing it would fetch
    for row in out.rows:  # those that ran in the tables, the others in the list of what did not run
        assert (f">{row.label}</td>" in html) == bool(row.ok_runs) and (row.ok_runs or row.label in html)
    csv_lines = (sweep / "report.csv").read_text().strip().splitlines()
    assert len(csv_lines) == 1 + len(out.rows)
    assert json.loads((sweep / "report.json").read_text())["baseline"] == "single O0"


def test_cli_merges_folders_and_skips_a_corrupt_file(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    write(a, "0", results("single", "O0", ["cpu"], [1.0, 0.5], rate=100.0))
    write(b, "0", results("ddp", "O0", ["cpu:0", "cpu:1"], [1.0, 0.5], rate=150.0))
    (b / "1").mkdir()
    (b / "1" / "results.json").write_text('{"schema": 1, "status": "o')  # half-written
    out = tmp_path / "merged"
    assert report.main([str(a), str(b), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and str(b / "1" / "results.json") in err
    md = (out / "report.md").read_text()
    assert "| single O0 |" in md and "| ddp O0 |" in md and str(b / "1" / "results.json") in md
    assert report.main([str(tmp_path / "nope")]) == 2


# ---- figures whose wrong-but-plausible versions must not pass (mean for median, unscaled, swapped) ----

def rows_of(folder):
    rows, _ = report.build_rows(report.find_results([folder])[0])
    return {r.label: r for r in rows}


def test_s_per_20_is_the_median_of_steady_windows_scaled_by_log_every(tmp_path):
    """log_every=10, steady windows 0.5, 0.5, 2.0 s: per 20 iterations 1.0, 1.0, 4.0 -> median 1.0
    (the mean would be 2.0; forgetting the scaling to 20 iterations, 0.5). One run: no interval, whatever
    the windows (they vary within one process; runs vary more)."""
    write(tmp_path, "a", results("single", "O0", ["cpu"], [9.0, 0.5, 0.5, 2.0], rate=100.0, every=10))
    row = rows_of(tmp_path)["single O0"]
    assert row.s_per_20 == pytest.approx(1.0)
    assert row.s_per_20_p10 == pytest.approx(1.0) and row.s_per_20_p90 == pytest.approx(3.4)
    assert row.steady_windows == 3 and not row.spread_known and row.s_per_20_lo is None


def test_s_per_20_over_runs_is_the_geometric_mean_of_each_runs_median_window(tmp_path):
    """Run medians 1.0 and 4.0 s per 20 (windows 1,1,3 and 4,4,0.5): geometric mean 2.0 (pooling all six
    windows would give a median of 2.0 too, so the second run's windows are 4, 4, 0.5: pooled median 2.5)."""
    write(tmp_path, "a", results("single", "O0", ["cpu"], [9.0, 1.0, 1.0, 3.0], rate=100.0))
    write(tmp_path, "b", results("single", "O0", ["cpu"], [9.0, 4.0, 4.0, 0.5], rate=100.0))
    row = rows_of(tmp_path)["single O0"]
    assert row.s_per_20 == pytest.approx(2.0) and row.spread_known
    assert row.s_per_20_lo < 2.0 < row.s_per_20_hi


def test_throughput_over_repeats_is_the_geometric_mean(tmp_path):
    for i, rate in enumerate([100.0, 110.0, 400.0]):  # median 110, mean 203.3, geometric mean 163.9
        write(tmp_path, f"r{i}", results("single", "O0", ["cpu"], [1.0, 0.5], rate=rate))
    row = rows_of(tmp_path)["single O0"]
    assert row.throughput == pytest.approx(163.86, abs=0.01)


def test_table_cells_sit_under_their_own_headers(sweep):
    rows, _ = report.build_rows(report.find_results([sweep])[0])
    header, body = report.table_rows(rows)
    ddp = dict(zip(header, body[[r.label for r in rows].index("ddp O0")], strict=True))
    assert ddp["img/s [95 %]"] == "1280.0 (spread unknown)" and ddp["speedup [95 %]"] == "2.00×"
    assert ddp["efficiency"] == "100%"
    assert ddp["mem max MiB"] == "1000" and ddp["mem min MiB"] == "800" and ddp["procs"] == "2"
    assert ddp["s/20 it [95 %]"] == "0.500 (spread unknown)"


def in_round(data: dict, number: int) -> dict:
    return {**data, "round": number}


def test_a_win_needs_runs_in_rounds_not_windows(tmp_path):
    # one run each with windows far apart: no win (the windows of one process say nothing of the next)
    write(tmp_path, "a", results("single", "O0", ["cpu"], [5.0, 1.0, 1.0, 1.0], rate=640.0))
    write(tmp_path, "b", results("single", "O1", ["cpu"], [5.0, 2.0, 2.0, 2.0], rate=320.0))
    assert report.decide(list(rows_of(tmp_path).values())).winners == {}
    # three rounds, O0 about 2x O1 in each (+-1 %): the win is clear, and both figures star the same row
    sweep = tmp_path / "rounds"
    for number, (a, b) in enumerate([(640.0, 320.0), (646.0, 317.0), (634.0, 322.0)], start=1):
        write(sweep, f"r{number}a", in_round(results("single", "O0", ["cpu"], [5.0, 1.0], rate=a), number))
        write(sweep, f"r{number}b", in_round(results("single", "O1", ["cpu"], [5.0, 2.0], rate=b), number))
    rows = list(rows_of(sweep).values())
    assert report.decide(rows).winners == {"throughput": "single O0", "s_per_20": "single O0"}
    o1 = next(r for r in rows if r.label == "single O1")
    assert o1.speedup == pytest.approx(0.5, rel=0.02) and o1.speedup_hi < 1 and o1.speedup_word == "slower"


def test_no_win_where_the_spread_is_unknown(tmp_path):
    """One run with one steady window each: 2x apart, but nothing says how far identical runs scatter."""
    write(tmp_path, "a", results("single", "O0", ["cpu"], [5.0, 2.0], rate=320.0))
    write(tmp_path, "b", results("single", "O1", ["cpu"], [5.0, 1.0], rate=640.0))
    rows = list(rows_of(tmp_path).values())
    assert not any(r.spread_known for r in rows) and report.decide(rows).winners == {}
    assert "spread unknown" in report.decide(rows).reproducibility
    assert "1.000 (spread unknown)" in report.to_markdown(report.of_rows(rows, None))


def memory_results(amp, maxima, pids=(100, 101)):
    return [results("ddp", amp, ["cpu:0", "cpu:1"], [1.0, 0.5, 0.5, 0.5], rate=100.0, peaks=[m + 100.0, 500.0],
                    pids=list(pids)) for m in maxima]


def test_memory_is_pooled_over_repeats_and_wins_only_beyond_their_spread(tmp_path):
    for i, r in enumerate(memory_results("O0", [900.0, 950.0, 5000.0])):  # median of the maxima: 950
        write(tmp_path, f"a{i}", r)
    for i, r in enumerate(memory_results("O1", [1000.0, 1100.0], pids=(200, 201))):
        write(tmp_path, f"b{i}", r)
    rows = rows_of(tmp_path)
    a = rows["ddp O0"]
    assert (a.memory.max_mib, a.memory.max_lo, a.memory.max_hi) == (950.0, 900.0, 5000.0)
    assert a.memory.per_device == (DeviceUse("cpu:0", 950.0, (100,)), DeviceUse("cpu:1", 400.0, (101,)))
    assert a.processes == 2
    assert "mem_max_mib" not in report.decide(list(rows.values())).winners  # 900-5000 overlaps 1000-1100
    write(tmp_path, "c0", memory_results("O2", [300.0])[0])
    write(tmp_path, "c1", memory_results("O2", [320.0])[0])
    assert report.decide(list(rows_of(tmp_path).values())).winners["mem_max_mib"] == "ddp O2"


def test_memory_win_needs_repeats(tmp_path):
    write(tmp_path, "a", memory_results("O0", [300.0])[0])
    write(tmp_path, "b", memory_results("O1", [3000.0])[0])
    assert "mem_max_mib" not in report.decide(list(rows_of(tmp_path).values())).winners


def test_efficiency_is_against_the_one_device_row_at_the_same_amp_level(tmp_path):
    write(tmp_path, "s0", results("single", "O0", ["cpu"], [1.0, 1.0], rate=100.0))
    write(tmp_path, "s1", results("single", "O1", ["cpu"], [1.0, 1.0], rate=200.0))
    write(tmp_path, "d1", results("ddp", "O1", ["cpu:0", "cpu:1"], [1.0, 1.0], rate=300.0))
    rows = rows_of(tmp_path)
    assert rows["ddp O1"].speedup == pytest.approx(3.0)  # against the baseline, single O0
    assert rows["ddp O1"].efficiency == pytest.approx(0.75)  # 300 / (2 x 200), not 300 / (2 x 100)
    assert rows["single O1"].efficiency is None and rows["single O0"].efficiency is None


def test_report_csv_holds_plain_numbers(sweep):
    import csv

    report.build_report([sweep], sweep, quiet=True)
    with open(sweep / "report.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    from harness.report.tables import TEXT_CSV

    text = set(TEXT_CSV)  # the text columns; every other one holds a number
    assert {"combination", "strategy", "amp", "model", "devices", "status", "reason", "variant"} <= text
    numbers = [{k: float(v) for k, v in row.items() if k not in text} for row in table]
    ddp = numbers[[row["combination"] for row in table].index("ddp O0")]
    assert ddp["img_s"] == 1280.0 and ddp["speedup"] == 2.0 and ddp["efficiency"] == pytest.approx(1.0)
    assert ddp["s_per_20"] == 0.5 and ddp["mem_max_mib"] == 1000.0 and ddp["n_devices"] == 2.0
    assert ddp["img_s_lo"] != ddp["img_s_lo"] and ddp["rounds"] == 1.0  # nan: one run has no interval
    assert ddp["cumulative_s_at_100"] == 3.0
    skipped = numbers[[row["combination"] for row in table].index("dp O0")]
    assert skipped["img_s"] != skipped["img_s"]  # nan: no figure


def test_a_merge_never_writes_over_a_sweeps_own_report(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    write(a, "0", results("single", "O0", ["cpu"], [1.0, 0.5], rate=100.0))
    write(b, "0", results("ddp", "O0", ["cpu:0", "cpu:1"], [1.0, 0.5], rate=150.0))
    (a / "report.md").write_text("sweep a's own report")
    monkeypatch.chdir(tmp_path)
    assert report.main([str(a), str(b)]) == 0
    assert (a / "report.md").read_text() == "sweep a's own report" and not (b / "report.md").exists()
    merged = list((tmp_path / "runs" / "reports").glob("*/report.md"))
    assert len(merged) == 1 and "| single O0 |" in merged[0].read_text() and "| ddp O0 |" in merged[0].read_text()
    assert report.main([str(a), "--out", str(b)]) == 2  # a folder holding runs is theirs
    assert not (b / "report.md").exists()


def test_index_html_says_when_what_and_how_and_holds_every_row(sweep):
    import html.parser

    for i, name in enumerate(("0_single_O0", "1_ddp_O0")):
        path = sweep / name / "results.json"
        data = json.loads(path.read_text())
        data["env"] = {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "gpu_names": [], "torch": "2.14.1",
                       "python": "3.11.7", "command": "python run.py -m strategy=single,ddp",
                       "harness_commit": "abc1234"}
        data["started_at"], data["finished_at"] = 1_700_000_000.0 + i, 1_700_000_100.0 + i
        path.write_text(json.dumps(data))
    out = report.build_report([sweep], sweep / "out", quiet=True)
    page = (sweep / "out" / "index.html").read_text()

    class Cells(html.parser.HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.rows, self.imgs, self.meta, self._in = 0, [], [], None

        def handle_starttag(self, tag, attrs):
            self.rows += tag == "tr"
            if tag == "img":
                self.imgs.append(dict(attrs)["src"])
            self._in = tag

        def handle_data(self, data):
            if self._in == "dt":
                self.meta.append(data)

    parsed = Cells()
    parsed.feed(page)
    assert parsed.meta == ["when", "runs", "machine", "versions", "kernels", "command", "harness commit"]
    for fact in ("AMD EPYC (AVX2), no GPU", "torch 2.14.1", "python run.py -m strategy=single,ddp", "abc1234"):
        assert fact in page
    ran = [r for r in out.rows if r.ok_runs]
    sections = page.count("<table>")
    assert parsed.rows == sections * (1 + len(ran))  # in each section a header row, then one per combination that ran
    assert parsed.imgs and all(src.startswith("data:image/png;base64,") for src in parsed.imgs)
    assert "Highest measured: ddp O0, 1280.0 img/s, 2.00× single O0 by the round-adjusted levels; not judged" in page  # the verdict
    assert page.index("Verdict:") < page.index("<table")  # before any table
    assert 'data-v="1280.0"' in page and "<script>" in page  # sortable by the numbers themselves


def test_the_terminal_table_fits_80_columns_and_groups_reasons(sweep):
    write(sweep, "4_apex_ddp_O0", results("apex_ddp", "O0", ["cpu"], [], status="skipped",
                                            error="strategy=dp: needs two or more CUDA GPUs"))
    rows, base = report.build_rows(report.find_results([sweep])[0])
    text = report.terminal_table(report.of_rows(rows, base), width=80)
    verdict, tables = text.split("\nDid not run here:")[0].split("\n", 1)
    assert verdict.startswith("Verdict: ")  # first, before the tables
    assert max(len(line) for line in tables.splitlines()) <= 80
    assert tables.index("Speed") < tables.index("Memory")  # the page's sections, in its order
    assert "1280.0" in tables and "2.00×" in tables  # the figures are whole, not cut
    assert "dp O0" not in tables.replace("ddp O0", "") and "apex_ddp" not in tables  # no row for what did not run
    listed = text.split("\nDid not run here:\n")[1].split("\nHow reproducible")[0]
    assert max(len(line) for line in listed.splitlines()) <= 80  # wrapped
    reasons = [line for line in text.splitlines() if line.startswith("  ") and not line.startswith("    ")]
    assert reasons[0] == "  skipped: strategy=dp: needs two or more CUDA GPUs: dp O0, apex_ddp O0"
    assert len(reasons) == 2 and reasons[1].startswith("  failed: rank 1 (pid 7)")  # one entry per reason


def test_plots_encode_strategy_by_colour_and_amp_by_style(sweep):
    from harness.report.plots import AMP_STYLE, strategy_colours, style

    rows, _ = report.build_rows(report.find_results([sweep])[0])
    colours = strategy_colours(rows)
    by = {r.label: r for r in rows}
    assert style(by["single O0"], colours)["color"] != style(by["ddp O0"], colours)["color"]
    assert style(by["ddp O0"], colours)["color"] == style(by["ddp O1"], colours)["color"]
    assert style(by["ddp O1"], colours)["linestyle"] == AMP_STYLE["O1"][0] != AMP_STYLE["O0"][0]
    assert strategy_colours(rows[:1])["single"] == colours["single"]  # stable across reports


def with_profile(data: dict, shares: dict, overlapped: float, total: float, *, wait: float, energy: float | None) -> dict:
    run = {"rank": 1, "view": "host", "span_s": 1.0, "end_iter": 40, "window_s": 1.0, "shares": shares,
           "parts_s": dict(shares), "communication_total_s": total, "communication_overlapped_s": overlapped}
    data["windows"][1]["profiled"] = True  # the first steady window was profiled: out of the steady figures
    return {**data, "data_wait_share": wait, "energy_j_per_image": energy,
            "profile": {"run": run, "per_rank": {"1": run}, "traces": ["traces/rank0.json"], "slowdown": 1.5}}


def test_breakdown_shares_per_row_and_its_plot_in_the_page(tmp_path):
    ddp = {"compute": 0.40, "communication": 0.30, "data_wait": 0.20, "optimizer": 0.05, "other": 0.05}
    single = {"compute": 0.90, "communication": 0.0, "data_wait": 0.05, "optimizer": 0.03, "other": 0.02}
    # windows: warm-up 2.0, profiled 9.0 (left out), then 1.0 and 3.0: median 2.0 s per 20 iterations
    write(tmp_path, "0_ddp_O0", with_profile(results("ddp", "O0", ["cpu:0", "cpu:1"], [2.0, 9.0, 1.0, 3.0], rate=320.0),
                                             ddp, overlapped=0.1, total=0.4, wait=0.25, energy=None))
    write(tmp_path, "1_single_O0", with_profile(results("single", "O0", ["cpu"], [2.0, 9.0, 1.0, 3.0], rate=320.0),
                                                single, overlapped=0.0, total=0.0, wait=0.04, energy=1.5))
    out = report.build_report([tmp_path], tmp_path / "out", quiet=True)
    by = {r.label: r for r in out.rows}
    assert by["ddp O0"].s_per_20 == pytest.approx(2.0) and by["ddp O0"].steady_windows == 2
    assert by["ddp O0"].profile.breakdown == ddp and by["ddp O0"].profile.comm_overlapped_share == pytest.approx(0.25)
    assert by["single O0"].profile.comm_overlapped_share is None  # no communication at all: nothing to overlap
    header, body = report.table_rows(out.rows)
    cells = dict(zip(header, body[[r.label for r in out.rows].index("ddp O0")], strict=True))
    assert cells["profiled: compute/comm/data/optim/other %"] == "40/30/20/5/5"
    assert (cells["data wait"], cells["comm overlapped"], cells["J/image"]) == ("25%", "25%", "—")
    single_cells = dict(zip(header, body[[r.label for r in out.rows].index("single O0")], strict=True))
    assert single_cells["J/image"] == "1.500"
    assert (tmp_path / "out" / "breakdown.png").exists()
    page = (tmp_path / "out" / "index.html").read_text()
    section = page[page.index('<section id="time">'):]
    assert 'alt="breakdown"' in section[:section.index("</section>")]  # inside the page, in its section
    import csv

    with open(tmp_path / "out" / "report.csv") as handle:
        rows = {r["combination"]: r for r in csv.DictReader(handle)}
    assert float(rows["ddp O0"]["profiled_communication_share"]) == 0.3
    assert float(rows["ddp O0"]["data_wait_share"]) == 0.25 and rows["ddp O0"]["energy_j_per_image"] == "nan"


def test_no_breakdown_plot_without_a_profiled_run(sweep):
    out = report.build_report([sweep], sweep / "out", quiet=True)
    assert not (sweep / "out" / "breakdown.png").exists() and all(r.profile is None for r in out.rows)


def test_labels_name_what_differs_once_and_the_same_way(tmp_path):
    """A sweep over comm hooks: the hooked rows carry the variant `comm_hook=fp16`; the plain row says its own
    value the same way, not `strategy.comm_hook=none`. A skipped combination never ran: its unknown devices,
    dtype and launcher are no difference, so neither its label nor its peers' grow `devices= launcher=None`."""
    def hooked(hook, **kwargs):
        data = results("fsdp", "O0", ["cpu:0", "cpu:1"], [1.0, 0.5, 0.5], rate=100.0, **kwargs)
        data["config"] = {"strategy": {"_target_": "strategies.fsdp.FSDP2", "comm_hook": hook}}
        data["variant"] = "" if hook == "none" else f"comm_hook={hook}"
        return data

    write(tmp_path, "0", hooked("none"))
    write(tmp_path, "1", hooked("bf16"))
    never = hooked("powersgd", status="skipped", error="strategy.comm_hook=powersgd is not allowed")
    never.update(devices=[], launcher=None, precision={"impl": None, "dtype": None}, image_size=None)
    write(tmp_path, "2", never)
    assert sorted(rows_of(tmp_path)) == ["fsdp O0 comm_hook=bf16", "fsdp O0 comm_hook=none",
                                         "fsdp O0 comm_hook=powersgd"]


def test_runs_without_a_steady_window_are_said_to_be_untimed_not_missing(tmp_path):
    """parity=true allows too few iterations for a steady window: such rows ran (status ok, no throughput)."""
    write(tmp_path, "0_single_O0", results("single", "O0", ["cpu"], [2.0]))
    write(tmp_path, "1_dp_O0", results("dp", "O0", ["cpu"], [], status="skipped", error="needs GPUs"))
    rows, baseline = report.build_rows(report.find_results([tmp_path])[0])
    said = report.decide(rows).verdict
    assert said.startswith("No timing: single O0 ran without a steady window") and "No combination ran" not in said
    assert said.endswith("Did not run here: 1 skipped (reasons below).")


def test_every_strategy_yaml_has_its_own_colour() -> None:
    """A new conf/strategy/*.yaml gets a colour without editing plots.py; no two strategies share one."""
    from harness.report.plots import PALETTE, STRATEGY_ORDER

    yamls = {p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "strategy").glob("*.yaml")}
    assert yamls <= set(STRATEGY_ORDER)
    assert len(STRATEGY_ORDER) <= len(PALETTE) and len(set(STRATEGY_ORDER)) == len(STRATEGY_ORDER)


# ---- columns: one definition (harness/report/columns.py) for the terminal, report.md, report.csv, index.html ----

def _outputs(sweep):
    """Every table header of each output: report.md's and index.html's per section (lists of headers),
    report.csv's, and the terminal's text."""
    import csv
    import re

    report.build_report([sweep], sweep, quiet=True)
    rows, base = report.build_rows(report.find_results([sweep])[0])
    md = (sweep / "report.md").read_text()
    md_headers = [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines()
                  if line.startswith("| combination")]
    with open(sweep / "report.csv", newline="") as handle:
        csv_header = next(csv.reader(handle))
    page = (sweep / "index.html").read_text()
    html_headers = [re.findall(r"<th[^>]*>([^<]*)</th>", table) for table in page.split("<table>")[1:]]
    terminal = report.terminal_table(report.of_rows(rows, base), width=200)
    return rows, md_headers, csv_header, html_headers, terminal


def test_report_csv_names_each_column_once(sweep):
    _, _, csv_header, _, _ = _outputs(sweep)
    assert len(csv_header) == len(set(csv_header)), sorted(h for h in csv_header if csv_header.count(h) > 1)
    assert csv_header.count("startup_s") == 1


def test_every_output_takes_its_columns_from_the_one_definition(sweep):
    import html

    from harness.report import columns

    rows, md, csv_header, html_headers, terminal = _outputs(sweep)
    tables = [[c.header for c in shown] for key, _ in columns.SECTIONS
              if (shown := columns.section_table(rows, key)[0])]
    assert md == tables and [[html.unescape(h) for h in t] for t in html_headers] == tables
    assert all(t[0] == "combination" and len(t) <= 10 for t in tables)  # the name in every section, ≤ 10 columns
    assert [t[1] for t in tables] == ["devices", "20 it", "mem max MiB", "startup s"]  # speed, cumulative, memory, time
    assert csv_header == [name for c in columns.columns(rows) for name, _ in c.csv]
    heads = [c.terminal for c in columns.columns(rows) if c.terminal and c.shown(rows)]  # tok/s: token rows only
    assert heads == ["combination", "runs", "s/20 it", "img/s", "speedup", "mem MiB", "predicted peak MiB",
                     "measured peak MiB"]
    speed = next(line for line in terminal.splitlines() if "combination" in line and "img/s" in line)
    assert speed.index("runs") < speed.index("img/s") < speed.index("speedup") and "mem MiB" not in speed
    memory = next(line for line in terminal.splitlines() if "mem MiB" in line)
    assert "combination" in memory and "predicted peak MiB" in memory


def test_a_column_added_to_the_definition_appears_in_every_output(sweep, monkeypatch):
    from harness.report import columns

    defined = columns.columns
    extra = columns.Column("answer", lambda r: "42", csv=(("answer_csv", lambda r: 42),),
                           terminal="answer!", terminal_cell=lambda r: "forty-two", section="speed")
    monkeypatch.setattr(columns, "columns", lambda rows: [*defined(rows)[:-1], extra, defined(rows)[-1]])
    rows, md, csv_header, html_headers, terminal = _outputs(sweep)
    assert md[0][-1] == "answer" and html_headers[0][-1] == "answer"  # the speed section's last column
    assert csv_header[-3:] == ["answer_csv", "status", "reason"]
    assert "answer!" in terminal and "forty-two" in terminal
    assert "| 42 |" in (sweep / "report.md").read_text()


# ---- rows are what the user swept: runs pool only when their resolved configs agree (repeats aside) ----

def _with_config(data: dict, overrides: list[str], **config) -> dict:
    base = {"strategy": {"_target_": "strategies.single.SingleDevice"}, "optim": {"_target_": "torch.optim.SGD",
            "lr": 0.01}, "seed": 0, "repeat": 1, "batch_size": 32}
    for key, value in config.items():  # optim__lr=... sets optim.lr
        group, _, inner = key.partition("__")
        if inner:
            base[group] = {**base[group], inner: value}
        else:
            base[group] = value
    return {**data, "config": base, "overrides": overrides}


def test_an_axis_the_report_never_heard_of_is_a_row_of_its_own(tmp_path):
    """`-m optim.lr=0.01,0.0100001 repeat=3`: two rows of three runs, not one of six (issue 27 item 1)."""
    for i in range(3):
        for lr in (0.01, 0.0100001):
            write(tmp_path, f"{lr}_{i}", _with_config(results("single", "O0", ["cpu"], [1.0, 0.5, 0.5], rate=64.0),
                                                      [f"optim.lr={lr}", "repeat=3"], optim__lr=lr, repeat=3))
    rows = rows_of(tmp_path)
    assert sorted(rows) == ["single O0 optim.lr=0.01", "single O0 optim.lr=0.0100001"]
    assert [rows[k].runs for k in sorted(rows)] == [3, 3]


def test_a_swept_config_group_is_named_as_the_command_line_chose_it(tmp_path):
    """`-m strategy=single optim=sgd,adamw`: `single O0 optim=sgd` and `single O0 optim=adamw`."""
    write(tmp_path, "0", _with_config(results("single", "O0", ["cpu"], [1.0, 0.5], rate=64.0),
                                      ["strategy=single", "optim=sgd"]))
    write(tmp_path, "1", _with_config(results("single", "O0", ["cpu"], [1.0, 0.5], rate=70.0),
                                      ["strategy=single", "optim=adamw"],
                                      optim={"_target_": "torch.optim.AdamW", "lr": 0.001}))
    assert sorted(rows_of(tmp_path)) == ["single O0 optim=adamw", "single O0 optim=sgd"]


def test_repeats_of_one_config_pool_even_across_sweeps_with_other_repeat_counts(tmp_path):
    write(tmp_path, "a", _with_config(results("single", "O0", ["cpu"], [1.0, 0.5], rate=64.0), [], repeat=1))
    write(tmp_path, "b", _with_config(results("single", "O0", ["cpu"], [1.0, 0.5], rate=66.0), ["repeat=2"], repeat=2))
    rows = rows_of(tmp_path)
    assert list(rows) == ["single O0"] and rows["single O0"].runs == 2


@pytest.mark.parametrize("baseline, said", [
    ("dpp:O0", "error: --baseline=dpp:O0 is not allowed: a strategy:amp that ran here: ddp:O0, single:O0"),
    ("ddp:O1", "error: --baseline=ddp:O1 is not allowed: a strategy:amp that ran here: ddp:O0, single:O0"),  # failed
    ("single:O9", "error: --baseline=single:O9 is not allowed: strategy:amp, e.g. single:O0 or ddp"),
])
def test_a_baseline_no_row_can_be_is_one_line_exit_2_and_nothing_written(sweep, tmp_path, capsys, baseline, said):
    """Before: a Python UserWarning, and the speedups silently against single O0 (issue 27)."""
    from harness.report.command import main

    out = tmp_path / "out"
    assert main([str(sweep), "--out", str(out), "--baseline", baseline]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(said), err
    assert not out.exists()


# ---- the verdict's words, figures and advice (harness/report/decision.py) ----

def round_run(strategy: str, number: int, rate: float, *, repeat: int | None = None, busy: bool = False,
              overrides: list[str] | None = None) -> dict:
    data = in_round(results(strategy, "O0", ["cpu"], [1.0, 0.5], rate=rate), number)
    data["config"] = {"repeat": repeat, "verdict": {"margin": 0.05}}
    data["overrides"] = overrides or [f"strategy={strategy}", "amp=O0"]
    if busy:
        data["machine"] = {"busy": True, "reason": "others took 0.9 of 2 cores"}
    return data


def test_the_command_that_would_decide_a_sweep_gives_its_rounds_and_a_search_its_budget():
    """A sweep: exactly N rounds (repeat=N, its budget and round dropped). A search: the budget of N rounds at its
    own pace, whole minutes (22 rounds x 40 s = 880 s -> 900), so that it goes on racing instead of running every
    candidate it races 22 times; without a pace it has only repeat=N to give."""
    from harness.report.decision import rerun

    assert rerun("run.py -m strategy=ddp,single timing.budget_s=60 repeat=3", 22) == \
        "python run.py -m strategy=ddp,single repeat=22"
    searched = "python run.py -m search=true search.budget_s=20 batch_size=128"
    assert rerun(searched, 22, 40.0) == "python run.py -m search=true batch_size=128 search.budget_s=900"
    assert rerun(searched.replace("search=true", "search.enabled=true"), 22, 40.0).endswith(" search.budget_s=900")
    assert rerun(searched, 22) == f"{searched} repeat=22"
    assert rerun("python run.py -m strategy=ddp,single", 22, 40.0).endswith(" repeat=22")  # a sweep keeps repeat


def test_the_reproducibility_sentence_shows_the_figures_the_rule_used(tmp_path):
    """repeat=3 (one look), two rows: the pair's own per-round SD, its degrees of freedom and its level."""
    import math
    import statistics

    a, b = [100.0, 104.0, 98.0], [90.0, 95.0, 86.0]
    for n in range(3):
        write(tmp_path, f"r{n}a", round_run("single", n + 1, a[n], repeat=3))
        write(tmp_path, f"r{n}b", round_run("ddp", n + 1, b[n], repeat=3))
    said = report.decide(list(rows_of(tmp_path).values())).reproducibility
    sd = statistics.stdev(math.log(x / y) for x, y in zip(a, b, strict=True))
    assert f"per-round SD {100 * (math.exp(sd) - 1):.1f} % over 3 rounds (2 degrees of freedom), tested at 0.05" in said
    assert "1 pair" in said and "spent over" not in said  # one look: nothing spent


def test_a_busy_row_has_no_interval_no_speedup_no_efficiency_and_is_not_judged(tmp_path):
    """ddp's every run was timed on a busy machine: its own runs' figure is shown as such (no interval: the
    '±378445%' of before), no ratio or efficiency rests on it, and the verdict lists it as not judged."""
    for n, (a, b) in enumerate([(100.0, 500000.0), (102.0, 400000.0), (98.0, 450000.0)], start=1):
        write(tmp_path, f"r{n}a", round_run("single", n, a, repeat=3))
        write(tmp_path, f"r{n}b", {**round_run("ddp", n, b, repeat=3, busy=True), "devices": ["cpu:0", "cpu:1"]})
    rows = rows_of(tmp_path)
    busy = rows["ddp O0"]
    assert busy.busy and busy.throughput_lo is None and busy.throughput_hi is None and not busy.spread_known
    assert busy.speedup is None and busy.efficiency is None and busy.busy_runs == 3
    header, body = report.table_rows(list(rows.values()))
    cells = dict(zip(header, body[list(rows).index("ddp O0")], strict=True))
    assert cells["img/s [95 %]"].endswith("busy (no interval, not judged)") and cells["runs"] == "0 (+3 busy)"
    decision = report.decide(list(rows.values()))
    assert "Not judged (every run measured while the machine was busy): ddp O0." in decision.verdict
    assert "Only single O0 was timed" in decision.verdict  # the busy row is neither leader nor runner-up


def test_busy_runs_of_a_judged_row_are_named_not_dropped_silently(tmp_path):
    for n, rate in enumerate([100.0, 101.0, 99.0, 300.0, 20.0], start=1):
        write(tmp_path, f"r{n}", round_run("single", n, rate, repeat=5, busy=n > 3))
    row = rows_of(tmp_path)["single O0"]
    assert len(row.run_throughputs) == 3 and row.busy_runs == 2 and not row.busy
    header, body = report.table_rows([row])
    assert dict(zip(header, body[0], strict=True))["runs"] == "3 (+2 busy)"
    assert "busy runs left out: single O0 (2)" in report.decide([row]).reproducibility


def test_undecided_says_how_many_rounds_would_decide_and_the_command(tmp_path):
    """1.08x over 3 rounds with +-6 % swings: undecided. Per-round log ratios 0.0770, 0.1258, 0.0293: SD 0.0482
    (4.9 %). Planned for the 5 % margin at that spread, not for the 1.08 seen: (1.96 + 0.84)^2 x (0.0482 /
    0.0488)^2 = 7.7 rounds by the normal, 10 by the noncentral t, to tell 5 % apart, and 10 to show them within
    +-5 %; at 60 s a round, 10 min. The same spread around 1.02 gets the same advice."""
    from harness.verdict.sweep_record import SweepRecord

    plan = SweepRecord([["strategy=single"], ["strategy=ddp"]], ["single O0", "ddp O0"], repeat=3, budget_s=140.0,
                     margin=0.05, command="run.py -m strategy=single,ddp repeat=3", rounds_started=3,
                     ended_by="repeat", round_seconds=[60.0, 60.0, 60.0])
    said = {}
    for shift in (1.0, 1.02 / 1.08):
        folder = tmp_path / f"{shift:.3f}"
        for n, (a, b) in enumerate([(108.0, 100.0), (110.0, 97.0), (104.0, 101.0)], start=1):
            write(folder, f"r{n}a", round_run("single", n, a * shift, repeat=3))
            write(folder, f"r{n}b", round_run("ddp", n, b, repeat=3))
        said[shift] = report.decide(list(rows_of(folder).values()), plan).verdict
    # ddp over single, paired by round: mean log -0.0774, SE 0.0279; one look at the end at the pair's whole
    # 0.05 (two rows, repeat=3): t(0.975, 2) = 4.303, so exp(-0.0774 -+ 0.1199) = 0.82-1.04
    found = re.search(r"Undecided: single O0 \(.*\) leads; still open against it: ddp O0 0\.93× \[0\.82–1\.04\]; "
                      r"to tell 5 % apart: (\d+) rounds; to show them within ±5 %: (\d+) rounds \(at the noisiest open "
                      r"pair's per-round SD 4\.9 %\), about (\d+) min at this sweep's pace: python run\.py -m "
                      r"strategy=single,ddp repeat=(\d+)\.", said[1.0])
    assert found, said[1.0]
    assert tuple(map(int, found.groups())) == (10, 10, 10, 10)
    assert "still open against it: ddp O0 0.98×" in said[1.02 / 1.08]
    assert said[1.02 / 1.08].split("; to tell")[1] == said[1.0].split("; to tell")[1]  # never from the ratio seen


def test_an_interrupted_sweep_says_so_in_the_terms_typed_and_names_what_never_started(tmp_path):
    """repeat=3 was typed and Ctrl-C came in round 1: not 'rounds or repeat=N give one', but what happened."""
    from harness.verdict.sweep_record import SweepRecord

    write(tmp_path, "0a", round_run("single", 1, 100.0, repeat=3, overrides=["strategy=single", "amp=O0", "round=1"]))
    write(tmp_path, "0b", round_run("ddp", 1, 90.0, repeat=3, overrides=["strategy=ddp", "amp=O0", "round=1"]))
    plan = SweepRecord([["strategy=single", "amp=O0"], ["strategy=ddp", "amp=O0"], ["strategy=allreduce", "amp=O0"]],
                     ["single O0", "ddp O0", "allreduce O0"], repeat=3, budget_s=140.0, margin=0.05,
                     rounds_started=1)
    found = report.find_results([tmp_path])[0]
    rows, _ = report.build_rows(found)
    said = report.decide(rows, plan, started=[r.overrides for _, r in found]).verdict
    assert "the sweep was interrupted in round 1 of repeat=3" in said
    assert "Never started (the sweep was interrupted): allreduce O0." in said
    assert "rounds or repeat=N give one" not in said


def test_stopped_early_only_for_the_rows_racing_stopped_as_rounds_json_says(tmp_path):
    """repeat=3, ddp's round-3 run busy: its last quiet round is 2, yet nothing stopped it (no '(stopped r2)').
    Racing, ddp run in rounds 1-2 only and rounds.json naming it stopped after round 2: stopped r2; the same runs
    without a plan (a merged report) say nothing of stopping."""
    from harness.report.findings import compute
    from harness.verdict.rounds import RoundsOutcome
    from harness.verdict.sweep_record import NAME, SweepRecord

    combinations, names = [["strategy=single", "amp=O0"], ["strategy=ddp", "amp=O0"]], ["single O0", "ddp O0"]
    fixed, racing = tmp_path / "fixed", tmp_path / "racing"
    for n, (a, b) in enumerate([(100.0, 60.0), (102.0, 61.0), (98.0, 59.0)], start=1):
        write(fixed, f"r{n}a", round_run("single", n, a, repeat=3))
        write(fixed, f"r{n}b", round_run("ddp", n, b, repeat=3, busy=n == 3))
        write(racing, f"r{n}a", round_run("single", n, a))
        if n < 3:
            write(racing, f"r{n}b", round_run("ddp", n, b))
    SweepRecord(combinations, names, repeat=3, budget_s=140.0, margin=0.05, rounds_started=3, ended_by="repeat"
              ).write(fixed)
    rows = {r.label: r for r in compute([fixed]).rows}
    assert rows["ddp O0"].stopped_early is None and rows["single O0"].stopped_early is None
    header, body = report.table_rows(list(rows.values()))
    assert dict(zip(header, body[list(rows).index("ddp O0")], strict=True))["runs"] == "2 (+1 busy)"

    plan = SweepRecord(combinations, names, repeat=None, budget_s=140.0, margin=0.05)
    plan.update(RoundsOutcome(rounds=3, planned=5, stopped={1: 2}, started=3, ended_by="budget"))
    assert plan.stopped == {"ddp O0": 2}
    plan.write(racing)
    assert json.loads((racing / NAME).read_text())["stopped"] == {"ddp O0": 2}  # keys by name, as JSON has them
    rows = {r.label: r for r in compute([racing]).rows}
    assert rows["ddp O0"].stopped_early == 2 and rows["single O0"].stopped_early is None
    header, body = report.table_rows(list(rows.values()))
    assert dict(zip(header, body[list(rows).index("ddp O0")], strict=True))["runs"] == "2 (stopped r2)"
    (racing / NAME).unlink()
    assert all(r.stopped_early is None for r in compute([racing]).rows)


def test_a_clear_place_effect_is_said_in_how_reproducible(tmp_path):
    """Three rows in the Williams orders, 6 rounds, the first run of each round 10 % slower: the report says the
    1st run ran at about exp(log 0.9 x 2/3) = 0.93x the round's average; the same runs with no effect say nothing."""
    from harness.verdict.rounds import balanced_order

    for slow, folder in ((0.9, tmp_path / "placed"), (1.0, tmp_path / "flat")):
        for number in range(1, 7):
            for place, key in enumerate(balanced_order([0, 1, 2], number - 1), start=1):
                data = round_run(["single", "ddp", "zero"][key], number,
                                 100.0 * (slow if place == 1 else 1.0) * (1 + 0.003 * ((number + key) % 3)), repeat=6)
                data["place"] = place
                write(folder, f"r{number}_{key}", data)
        said = report.decide(list(rows_of(folder).values())).reproducibility
        if slow < 1:
            assert re.search(r"a run's place in its round mattered on this machine: the 1st run ran at 0\.93× "
                             r"\[0\.9\d–0\.9\d\] the round's average", said), said
        else:
            assert "place in its round" not in said, said


# ---- issue 53: what the page, report.md and the plots say of busy rows, devices and kernels ----

def test_a_busy_rows_time_error_is_not_judged_in_report_md_or_csv(tmp_path):
    """Every run of ddp was timed on a busy machine: its time error (others' work in its time, -2626.4 % once)
    reads `— (busy)` in report.md, with the reason under the table, and is nan in report.csv; the quiet row's
    error stays a figure."""
    import csv

    from harness.prediction.report import PredictionSection
    from harness.report.rows import measured_beside_predicted

    for n, (a, b) in enumerate([(100.0, 4000.0), (102.0, 4100.0), (98.0, 3900.0)], start=1):
        write(tmp_path, f"r{n}a", round_run("single", n, a, repeat=3))
        write(tmp_path, f"r{n}b", {**round_run("ddp", n, b, repeat=3, busy=True), "devices": ["cpu:0", "cpu:1"]})
    rows = rows_of(tmp_path)
    for row in rows.values():
        row.prediction = PredictionSection(predicted_s_per_it=0.0125)
        measured_beside_predicted(row)
    assert rows["ddp O0"].busy and rows["ddp O0"].prediction.time_error is not None
    made = report.of_rows(list(rows.values()), "single O0")
    md = report.to_markdown(made)
    section = md[md.index("## Predicted before each run"):]
    cells = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").rsplit(" | ", 1)[1]
             for line in section.splitlines() if line.startswith("| ") and "O0" in line}
    assert cells["ddp O0"] == "— (busy)" and cells["single O0"].endswith(" %") and "—" not in cells["single O0"]
    assert "shows its time error as `— (busy)`" in section
    report.write_csv(list(rows.values()), tmp_path / "report.csv")
    with open(tmp_path / "report.csv") as handle:
        by = {r["combination"]: r for r in csv.DictReader(handle)}
    assert by["ddp O0"]["time_error"] == "nan" and float(by["single O0"]["time_error"]) == rows["single O0"].prediction.time_error


def test_devices_are_said_as_ranges_so_eight_gpus_take_one_short_cell():
    from harness.report.columns import devices_said

    assert devices_said([f"cuda:{i}" for i in range(8)]) == "cuda:0–7"
    assert devices_said(["cpu:0", "cpu:1"]) == "cpu:0,1" and devices_said(["cpu"]) == "cpu"
    assert devices_said(["cuda:0", "cuda:1", "cuda:2", "cuda:5", "n1/cuda:0", "n1/cuda:1"]) == \
        "cuda:0–2,5, n1/cuda:0,1"
    assert devices_said([]) == "—"


def test_cudnn_benchmark_is_not_said_on_where_it_does_not_apply():
    """torch holds cudnn.benchmark=True on a CPU machine too; the rank records None off CUDA, said as n/a."""
    from harness.core.results import KernelsRecord

    assert KernelsRecord(None, "highest", False).words().startswith("cudnn.benchmark n/a (no CUDA), ")
    assert KernelsRecord(True, "high", True).words().startswith("cudnn.benchmark on, channels_last on")
    assert KernelsRecord(False, "high", True).words().startswith("cudnn.benchmark off")


def test_the_throughput_axis_is_the_bars_not_an_absurd_whisker_and_busy_rows_have_none(tmp_path):
    """Bars near 100-130 img/s; one judged row's interval reaches 6,700 and a busy row has no interval: the axis
    ends from the bars (within WHISKER_ROOM of the longest), the long whisker is cut with an arrow and its end
    written, and only the judged rows get whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    from harness.report.plots import WHISKER_ROOM, throughput_figure
    from harness.report.rows import Row

    def row(label: str, rate: float, lo: float | None, hi: float | None, busy: str | None = None) -> Row:
        strategy, amp = label.split()
        return Row(label=label, strategy=strategy, amp=amp, model="resnet18", devices=["cpu"], processes=1,
                   global_batch=32, status="ok", reason=None, runs=3, ok_runs=3, throughput=rate, throughput_lo=lo,
                   throughput_hi=hi, spread_known=lo is not None, busy=busy)

    rows = [row("single O0", 100.0, 95.0, 105.0), row("ddp O0", 120.0, 60.0, 6700.0),
            row("zero O0", 130.0, None, None, busy="other processes used 1.9 of 2 cores")]
    fig = throughput_figure(rows, rows, "single O0")
    ax = fig.axes[0]
    left, right = ax.get_xlim()
    assert left == 0 and 130 < right <= WHISKER_ROOM * 130 < 6700, (left, right)
    assert sum(isinstance(c, ErrorbarContainer) for c in ax.containers) == 2  # not the busy row's
    assert "to 6700 " in [t.get_text() for t in ax.texts] and "▸ a whisker past the axis" in ax.get_xlabel()
    plt.close(fig)
    fig = throughput_figure(rows[:1], rows[:1], "single O0")  # nothing cut: the whisker is inside, no note
    assert fig.axes[0].get_xlim()[1] >= 105 and "▸" not in fig.axes[0].get_xlabel()
    plt.close(fig)


def test_the_throughput_fit_is_built_once_for_the_rows_and_the_verdict(sweep, monkeypatch):
    """The rows' levels and speedups and the verdict's standing come from one fit (harness.report.rows.row_set,
    handed to harness.report.decision by findings.compute), never from one built again."""
    from harness.report import decision, findings, rows

    built: list[str] = []
    fit_of = rows.row_fit

    def counted(rows_, figure="run_throughputs", planned=None):
        built.append(figure)
        return fit_of(rows_, figure, planned)

    monkeypatch.setattr(rows, "row_fit", counted)
    monkeypatch.setattr(decision, "row_fit", counted)
    made = findings.compute([sweep])
    assert built.count("run_throughputs") == 1 and built.count("run_s_per_20") == 1, built
    assert made.decision.margin is not None and made.decision.standing is not None
