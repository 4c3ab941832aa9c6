"""The real CLI end to end on CPU: DDP with 2 gloo workers, the single-device baseline, amp O0-O3."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import DDP_RUN, SHARED_GROUP, SINGLE_RUN, TINY, describe, run_cli, run_sweep

pytestmark = pytest.mark.slow
# The tiny model trains in seconds even where this CPU only emulates half precision (else: skipped, see
# tests/test_precision.py)
EMULATED_OK = "amp.allow_emulated=true"


def test_ddp_two_gloo_workers(cli_run):
    proc, r = cli_run(*DDP_RUN)
    assert proc.returncode == 0, describe(proc)
    assert r["status"] == "ok" and r["error"] is None
    assert (r["strategy"], r["amp"], r["model"]) == ("ddp", "O0", "tiny_cnn")
    assert r["devices"] == ["cpu:0", "cpu:1"] and r["world_size"] == 2
    assert r["global_batch"] == 8 and r["local_batch"] == 4  # equal per-rank batches

    windows = r["windows"]
    assert [w["end_iter"] for w in windows] == [20, 40]
    assert [w["warmup"] for w in windows] == [True, False]
    assert all(w["seconds"] > 0 for w in windows)
    assert r["throughput_img_s"] > 0

    per_rank = r["per_rank_windows"]
    assert sorted(per_rank) == ["0", "1"]
    for ws in per_rank.values():
        assert [w["end_iter"] for w in ws] == [20, 40]
    for i, w in enumerate(windows):  # the run's clock is its slowest rank
        assert w["cumulative_seconds"] == max(per_rank[k][i]["cumulative_seconds"] for k in per_rank)
    assert windows[0]["loss"] == pytest.approx((per_rank["0"][0]["loss"] + per_rank["1"][0]["loss"]) / 2)

    procs = r["memory"]["per_process"]
    assert sorted(p["rank"] for p in procs) == [0, 1]
    pids = {p["pid"] for p in procs}
    assert len(pids) == 2 and r["launcher_pid"] not in pids
    assert {p["rank"]: p["device"] for p in procs} == {0: "cpu:0", 1: "cpu:1"}
    assert all(p["peak_mib"] > 0 for p in procs)
    assert {p["pid"] for p in r["ranks"]} == pids  # the workers that trained are the ones measured
    assert [d["device"] for d in r["memory"]["per_device"]] == ["cpu:0", "cpu:1"]
    assert "[ddp O0] iter    40/40" in proc.stdout


def test_single_runs_inside_the_launcher(cli_run):
    proc, r = cli_run(*SINGLE_RUN)
    assert proc.returncode == 0, describe(proc)
    assert r["status"] == "ok"
    assert r["devices"] == ["cpu"] and r["world_size"] == 1 and r["local_batch"] == r["global_batch"] == 8
    procs = r["memory"]["per_process"]
    assert [(p["pid"], p["rank"], p["device"]) for p in procs] == [(r["launcher_pid"], 0, "cpu")]
    assert list(r["per_rank_windows"]) == ["0"]
    assert [w["warmup"] for w in r["windows"]] == [True, False, False]
    assert r["throughput_img_s"] > 0


def check_amp_run(proc, r, strategy: str, level: str) -> None:
    assert proc.returncode == 0, describe(proc)
    assert r["status"] == "ok", r["error"]
    assert (r["strategy"], r["amp"]) == (strategy, level)
    losses = [w["loss"] for w in r["windows"]]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < losses[0], losses
    precision = r["precision"]
    assert precision["level"] == level and precision["impl"] == "native"
    assert precision["dtype"] == ("float32" if level == "O0" else "bfloat16")  # the CPU default
    assert precision["master_weights"] is (level == "O2")
    assert precision["keep_batchnorm_fp32"] is (level != "O3")
    assert precision["loss_scale"] == 1.0  # bfloat16: nothing to scale
    assert precision["skipped_steps"] == 0


def sweep_of(tmp_path_factory: pytest.TempPathFactory, name: str, *overrides: str) -> dict[str, Any]:
    """One sweep of several amp levels (one interpreter and fork server for all, where a run each cost one apiece):
    amp level -> (the sweep's process, that combination's results)."""
    sweep = tmp_path_factory.mktemp(name) / "sweep"
    proc = run_sweep("strategy=single", *overrides, *TINY, "log_every=20", EMULATED_OK, sweep_dir=sweep,
                     one_core=True)  # one-process runs beside the other worker's: conftest.one_core_of_this_worker
    assert proc.returncode == 0, describe(proc)
    records = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"))]
    return {r["amp"]: (proc, r) for r in records}


@pytest.fixture(scope="module")
def amp_levels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return sweep_of(tmp_path_factory, "amp-levels", "amp=O1,O2,O3", "iterations=60")


@pytest.fixture(scope="module")
def float16_levels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return sweep_of(tmp_path_factory, "float16", "amp=O3,O2", "amp.dtype=float16", "amp.loss_scale=dynamic",
                    "amp.master_weights=false", "iterations=40")


def test_single_o0_trains(cli_run):
    proc, r = cli_run(*SINGLE_RUN)
    check_amp_run(proc, r, "single", "O0")


@pytest.mark.xdist_group("amp_sweeps")  # one worker starts the two sweeps (each worker would start them)
@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_single_amp_levels_train(amp_levels, level):
    proc, r = amp_levels[level]
    check_amp_run(proc, r, "single", level)


# O2 in the default suite (DDP over a cast model and its float32 masters); O1's autocast is the single run's above
@pytest.mark.parametrize("level", [pytest.param("O1", marks=pytest.mark.bench), "O2"])
def test_ddp_amp_levels_train(cli_run, level):
    proc, r = cli_run("strategy=ddp", "nprocs=2", f"amp={level}", *TINY, "iterations=60", "log_every=20", EMULATED_OK)
    check_amp_run(proc, r, "ddp", level)
    assert sorted(p["rank"] for p in r["memory"]["per_process"]) == [0, 1]
    assert sorted(r["per_rank_windows"]) == ["0", "1"]


@pytest.mark.bench  # in the default suite in-process: tests/test_amp.py, float16 weights stepped by the optimizer
@pytest.mark.xdist_group("amp_sweeps")  # one worker starts the two sweeps (each worker would start them)
@pytest.mark.parametrize("level", ["O3", "O2"])  # O3: its own loss scale; O2: amp.master_weights=false
def test_float16_weights_with_dynamic_scaling_train(float16_levels, level):
    """float16 weights stepped by the optimizer itself, loss scaled dynamically (CUDA's default dtype), through
    run.py. Before: GradScaler raised "Attempting to unscale FP16 gradients." at the first step."""
    proc, r = float16_levels[level]
    assert proc.returncode == 0, describe(proc)
    assert r["status"] == "ok", r["error"]
    precision = r["precision"]
    assert (precision["dtype"], precision["loss_scale"], precision["master_weights"]) == ("float16", "dynamic", False)
    assert precision["final_loss_scale"] == 2.0**16 and precision["skipped_steps"] == 0
    assert all(math.isfinite(w["loss"]) for w in r["windows"])


def test_an_inline_run_names_its_rank_and_pid_when_it_fails(tmp_path):
    """Before: "rank -1 (pid None): launcher: ..." for a failure inside the one-process run."""
    proc, r = run_cli("strategy=single", *TINY, "iterations=40", "fault.kind=raise", "fault.at_iter=25",
                      tmp_path=tmp_path, one_core=True)
    assert proc.returncode == 1, describe(proc)
    assert r["status"] == "failed"
    assert r["error"] == f"rank 0 (pid {r['launcher_pid']}): RuntimeError: injected fault (fault.kind=raise) " \
                         "at iteration 25 on rank 0"
    assert [w["end_iter"] for w in r["windows"]] == [20]


def test_every_repeat_runs_in_a_fresh_process(tmp_path):
    """A repeat inside the launcher would inherit the previous one's allocator and CUDA context."""
    proc, _ = run_cli("strategy=single", *TINY, "iterations=40", "repeat=2", tmp_path=tmp_path, one_core=True)
    assert proc.returncode == 0, describe(proc)
    runs = [json.loads((tmp_path / "run" / f"repeat-{i}" / "results.json").read_text()) for i in range(2)]
    pids = [r["ranks"][0]["pid"] for r in runs]
    assert all(r["status"] == "ok" for r in runs) and len(set(pids)) == 2
    assert runs[0]["launcher_pid"] not in pids


def test_auto_iterations_stop_every_rank_at_the_same_edge(cli_run):
    """iterations=auto on 2 gloo ranks: they stop together (else one would wait forever in a collective)."""
    proc, r = cli_run("strategy=ddp", "nprocs=2", *TINY, "iterations=auto", "log_every=5",
                      "timing.precision_pct=50", "timing.max_seconds=60")
    assert proc.returncode == 0, describe(proc)
    assert r["status"] == "ok" and r["iterations_requested"] == "auto"
    assert r["stopped_by"] == "precision"
    ends = [w["end_iter"] for w in r["windows"]]
    assert len(ends) >= 7 and r["iterations"] == ends[-1]  # 1 warm-up + at least 6 steady windows
    assert [[w["end_iter"] for w in ws] for ws in r["per_rank_windows"].values()] == [ends, ends]
    assert "/auto" in proc.stdout


def test_run_log_holds_the_progress_lines_and_the_summary(cli_run):
    proc, r = cli_run(*SINGLE_RUN)
    text = (Path(r["_run_dir"]) / "run.log").read_text()
    assert "[single O0] iter    60/60" in text and "status ok" in text and "results: " in text
    assert "[single O0] iter    60/60" in proc.stdout  # and the terminal got them too


@pytest.mark.xdist_group(SHARED_GROUP)  # one worker runs the shared sweep
def test_each_sweep_job_logs_its_own_ranks_and_summary(shared_sweep):
    sweep, proc = shared_sweep  # conftest: strategy=single,ddp,allreduce, 20 iterations
    single, ddp = (next(sweep.glob(f"*_{name}_O0")) / "run.log" for name in ("single", "ddp"))
    assert "[single O0] iter    20/20" in single.read_text() and "status ok" in single.read_text()
    text = ddp.read_text()
    assert "][rank 0 " in text and "][rank 1 " in text and "[ddp O0] iter    20/20" in text  # both ranks' lines
    assert "status ok" in text
    assert proc.stdout.count("[ddp O0] iter    20/20") == 1  # the terminal shows rank 0 only
    assert "report: " in (sweep / "sweep.log").read_text()
    assert not list(sweep.glob("*/logs"))  # no empty folders left by the elastic agent
