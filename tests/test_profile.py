"""profile=true and data=loader end to end on CPU: one sweep over DDP and hand-written all-reduce, each with two
gloo workers reading through a DataLoader with a worker process each."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import TINY, run_sweep

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("profile")]  # one worker runs the shared sweep
SWEEP = ("strategy=ddp,allreduce", "nprocs=2", *TINY, "data=loader", "data.num_workers=1", "profile=true",
         "iterations=30", "log_every=10")


@pytest.fixture(scope="session")  # module scope is torn down when xdist runs another module's test between
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    folder = tmp_path_factory.mktemp("profile") / "sweep"
    proc = run_sweep(*SWEEP, sweep_dir=folder, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {}
    for path in folder.glob("*/results.json"):
        r = json.loads(path.read_text())
        runs[r["strategy"]] = {**r, "_dir": path.parent, "_stdout": proc.stdout}
    assert sorted(runs) == ["allreduce", "ddp"]
    return folder, runs


@pytest.mark.parametrize("strategy", ["ddp", "allreduce"])
def test_breakdown_adds_up_to_the_profiled_window_and_a_trace_per_rank(sweep, strategy):
    _, runs = sweep
    r = runs[strategy]
    assert r["status"] == "ok", r["error"]
    profile = r["profile"]
    assert sorted(profile["per_rank"]) == ["0", "1"]
    for rank, part in profile["per_rank"].items():
        assert sum(part["parts_s"].values()) == pytest.approx(part["span_s"], rel=1e-9)
        own = next(w for w in r["per_rank_windows"][rank] if w["profiled"])
        # the profiler's span of the window against the rank's own clock: the same window within 5 %
        assert part["span_s"] == pytest.approx(own["seconds"], rel=0.05)
        assert part["end_iter"] == own["end_iter"] == 20  # the first window after the warm-up one
        assert part["communication_total_s"] > 0 and part["parts_s"]["communication"] > 0  # gloo all-reduces
        assert part["parts_s"]["compute"] > 0 and part["parts_s"]["optimizer"] > 0
    slowest = max(profile["per_rank"], key=lambda k: profile["per_rank"][k]["window_s"])
    assert profile["run"]["rank"] == int(slowest)
    assert sorted(profile["traces"]) == ["traces/rank0.json", "traces/rank1.json"]
    for trace in profile["traces"]:
        events = json.loads((r["_dir"] / trace).read_text())["traceEvents"]
        assert sum(e.get("name") == "harness.window" for e in events) == 1
    # the profiled window is in the record but out of the steady figures
    windows = r["windows"]
    assert [(w["warmup"], w["profiled"]) for w in windows] == [(True, False), (False, True), (False, False)]
    assert r["throughput_img_s"] == pytest.approx(8 * 10 / windows[2]["seconds"])
    assert profile["slowdown"] == pytest.approx(windows[1]["seconds"] / windows[2]["seconds"])


def test_allreduce_after_backward_overlaps_nothing(sweep):
    """Known by construction: `allreduce` all-reduces each gradient with a blocking call after backward, so no
    operator runs while a collective is in flight; the time the thread waits for gloo is exposed communication."""
    _, runs = sweep
    for rank, part in runs["allreduce"]["profile"]["per_rank"].items():
        assert part["communication_total_s"] > 0, rank
        assert part["communication_overlapped_s"] <= 0.02 * part["communication_total_s"], (rank, part)
        assert part["parts_s"]["communication"] == pytest.approx(part["communication_total_s"], rel=0.02), rank


@pytest.mark.parametrize("strategy", ["ddp", "allreduce"])
def test_loader_runs_record_their_wait_and_their_data_workers(sweep, strategy):
    _, runs = sweep
    r = runs[strategy]
    assert all(w["data_wait_s"] is not None and 0 < w["data_wait_s"] < w["seconds"] for w in r["windows"])
    steady = r["windows"][2]
    assert r["data_wait_share"] == pytest.approx(steady["data_wait_s"] / steady["seconds"])
    procs = r["memory"]["per_process"]
    ranks = {p["rank"]: p for p in procs if p["role"] == "rank"}
    data = [p for p in procs if p["role"] == "data"]
    assert sorted(p["rank"] for p in data) == [0, 1]  # one DataLoader worker per rank (persistent)
    assert all(p["device"] == ranks[p["rank"]]["device"] and p["pid"] not in {q["pid"] for q in ranks.values()}
               for p in data)
    for device in r["memory"]["per_device"]:  # a rank's device counts its worker's memory too
        assert device["peak_mib"] == pytest.approx(sum(p["peak_mib"] for p in procs if p["device"] == device["device"]),
                                                   abs=0.2)
    assert r["gpu_activity"] is None and r["energy_j_per_image"] is None  # no GPU: unavailable, not 0


def test_sweep_report_shows_the_breakdown(sweep):
    folder, runs = sweep
    assert (folder / "breakdown.png").stat().st_size > 1000
    assert 'alt="breakdown"' in (folder / "index.html").read_text()  # inside the page (a data URL)
    with open(folder / "report.csv") as handle:
        for row in csv.DictReader(handle):
            shares = [float(row[f"profiled_{p}_share"]) for p in ("compute", "communication", "data_wait",
                                                                   "optimizer", "other")]
            assert sum(shares) == pytest.approx(1.0, abs=1e-6)
    assert "profiled window (iterations to 20" in runs["ddp"]["_stdout"]
