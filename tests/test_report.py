"""The side-by-side report against results files whose figures are worked out by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness import report


def results(strategy, amp, devices, window_seconds, *, batch=32, status="ok", error=None, rate=None,
            peaks=None, pids=None, loss=2.0):
    cumulative, windows = 0.0, []
    for i, seconds in enumerate(window_seconds):
        cumulative += seconds
        windows.append({"end_iter": 20 * (i + 1), "seconds": seconds, "cumulative_seconds": cumulative,
                        "warmup": i == 0, "loss": loss - 0.1 * i})
    peaks = peaks or [1000.0] * len(devices)
    pids = pids or [100 + i for i in range(len(devices))]
    return {"schema": 1, "status": status, "error": error, "strategy": strategy, "amp": amp, "model": "resnet18",
            "devices": devices, "world_size": len(set(pids)), "global_batch": batch, "image_size": 32,
            "iterations": 20 * len(window_seconds), "log_every": 20, "launcher": "elastic/spawn",
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
    assert single.speedup == pytest.approx(1.0) and single.efficiency == pytest.approx(1.0)
    assert (ddp.mem_max_mib, ddp.mem_min_mib) == (1000.0, 800.0)
    assert ddp.mem_imbalance_pct == pytest.approx(25.0)  # (1000 - 800) / 800
    assert ddp.processes == 2 and single.processes == 1
    assert single.final_loss == pytest.approx(1.6)
    assert report.winners(rows)["throughput"] == "ddp O0"  # 1280 with no spread vs at most ~750


def test_failed_and_skipped_rows_keep_their_reason(sweep):
    rows, _ = report.build_rows(report.find_results([sweep])[0])
    by = {r.label: r for r in rows}
    assert by["dp O0"].status == "skipped" and "CUDA" in by["dp O0"].reason
    assert by["ddp O1"].status == "failed" and "rank 1" in by["ddp O1"].reason
    assert by["ddp O1"].throughput is None and by["ddp O1"].speedup is None
    md = report.to_markdown(rows, "single O0", [])
    assert "skipped: strategy=dp: needs two or more CUDA GPUs" in md
    assert "failed: rank 1 (pid 7): RuntimeError: boom" in md


def test_repeats_become_medians_with_spread(tmp_path):
    for i, rate in enumerate([100.0, 120.0, 110.0]):
        write(tmp_path, f"r{i}", results("ddp", "O2", ["cpu:0", "cpu:1"], [1.0, 0.5], rate=rate))
    rows, _ = report.build_rows(report.find_results([tmp_path])[0])
    assert len(rows) == 1 and rows[0].runs == 3
    assert (rows[0].throughput, rows[0].throughput_lo, rows[0].throughput_hi) == (110.0, 100.0, 120.0)


def test_differences_within_the_spread_are_not_wins(tmp_path):
    for i, rate in enumerate([100.0, 130.0]):
        write(tmp_path, f"a{i}", results("single", "O0", ["cpu"], [1.0, 0.5], rate=rate))
    for i, rate in enumerate([110.0, 140.0]):
        write(tmp_path, f"b{i}", results("ddp", "O0", ["cpu:0", "cpu:1"], [1.0, 0.5], rate=rate))
    rows, _ = report.build_rows(report.find_results([tmp_path])[0])
    assert "throughput" not in report.winners(rows)  # 125 vs 115, ranges 110-140 and 100-130 overlap


def test_report_files_plots_and_index(sweep):
    out = report.build_report([sweep], sweep, quiet=True)
    for name in ("report.md", "report.csv", "report.json", "index.html"):
        assert (sweep / name).is_file()
    pngs = sorted(p.name for p in sweep.glob("*.png"))
    assert len(pngs) >= 3 and all((sweep / p).stat().st_size > 1000 for p in pngs)
    html = (sweep / "index.html").read_text()
    assert set(re.findall(r'src="([^"]+\.png)"', html)) == set(pngs)
    for row in out.rows:
        assert f"<td>{row.label}</td>" in html
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
