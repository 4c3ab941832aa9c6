"""`run.py plan=true` (harness.planning): predictions for every combination without training, in seconds;
bad presets refused before anything is written; a run predicted not to fit is skipped with the reason; every
run's results.json holds the prediction beside the measurement."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO, RUN_PY, SHARED_GROUP, SINGLE_RUN, TINY, describe

PLAN_TINY = ("model=tiny_cnn", "data.image_size=8", "batch_size=64")


def plan_cli(*overrides: str, cwd: Path, env: dict[str, str] | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python <repo>/run.py OVERRIDES` started in `cwd`, where plan=true writes runs/plan/."""
    return RUN_PY.run([str(REPO / "run.py"), *overrides], timeout, {**os.environ, **(env or {})}, cwd=cwd)


def plan_json(cwd: Path) -> dict:
    (path,) = (cwd / "runs" / "plan").glob("*/plan.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_the_default_grid_on_h100x8_is_predicted_without_training(tmp_path):
    started = time.perf_counter()
    proc = plan_cli("-m", "plan=true", "plan.hardware=h100x8", *PLAN_TINY, cwd=tmp_path)
    took = time.perf_counter() - started
    assert proc.returncode == 0, describe(proc)
    rows = plan_json(tmp_path)["rows"]
    by = {(r["strategy"], r["amp"]): r for r in rows}
    assert {s for s, _ in by} == {"single", "ddp", "allreduce", "dp", "apex_ddp", "ignite"}
    assert {a for _, a in by} == {"O0", "O1", "O2", "O3"}
    ddp = by[("ddp", "O0")]["prediction"]
    assert by[("ddp", "O0")]["world_size"] == 8 and len(ddp["memory"]) == 8
    assert ddp["time"]["comm_s"] > 0 and ddp["s_per_iteration"] > 0 and ddp["fits"]
    dp = by[("dp", "O0")]["prediction"]["memory"]  # DataParallel: the base GPU holds more than the replicas
    assert len(dp) == 8 and dp[0]["peak_mib"] > dp[1]["peak_mib"] and dp[1]["optimizer_mib"] == 0
    assert by[("single", "O0")]["prediction"]["time"]["comm_s"] == 0
    o2 = by[("single", "O2")]["prediction"]["memory"][0]
    assert o2["params_mib"] > by[("single", "O3")]["prediction"]["memory"][0]["params_mib"]  # O2's fp32 masters
    assert not (tmp_path / "runs" / "multirun").exists()  # nothing trained, no sweep folder
    assert "Predicted peak memory per rank, MiB (h100x8)" in proc.stdout and "Predicted time per iteration" in proc.stdout
    assert took < 120, f"{took:.0f} s"


@pytest.mark.slow
def test_sweep_modern_across_nodes(tmp_path):
    proc = plan_cli("-m", "plan=true", "plan.hardware=h100x16-ib", "sweep=modern", "compile=false",
                    "strategy.comm_hook=none,powersgd", *PLAN_TINY, cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    rows = plan_json(tmp_path)["rows"]
    predicted = [r for r in rows if r["status"] == "predicted"]
    assert {r["strategy"] for r in predicted} == {"ddp", "zero", "fsdp"}
    assert all(r["world_size"] == 16 for r in predicted)
    fsdp = next(r for r in predicted if r["strategy"] == "fsdp" and r["amp"] == "O0")
    ddp = next(r for r in predicted if r["strategy"] == "ddp" and r["amp"] == "O0" and not r["variant"])
    assert fsdp["prediction"]["memory"][0]["params_mib"] < ddp["prediction"]["memory"][0]["params_mib"] / 10
    assert ddp["prediction"]["memory"][15]["device"] == "node1/cuda:7"
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert skipped and all("powersgd" in r["reason"] for r in skipped)


@pytest.mark.parametrize("overrides, said", [
    (("plan.hardware=h100x9",), "plan.hardware=h100x9 is not allowed: did you mean h100x8?"),
    (("plan.hardware=",), "plan.hardware= is not allowed"),
])
def test_a_bad_preset_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys, overrides, said):
    from harness import cli

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        cli.precheck(["plan=true", *overrides])
    assert stopped.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0], lines
    assert list(tmp_path.iterdir()) == []


def test_a_preset_with_no_device_memory_is_refused_before_anything_starts(tmp_path, monkeypatch):
    from harness import cli
    from harness.prediction import hardware

    presets = tmp_path / "presets"
    presets.mkdir()
    text = (hardware.PRESET_DIR / "h100x8.yaml").read_text().replace("device_memory_gib: 79.1", "device_memory_gib: 0")
    (presets / "mine.yaml").write_text(text)
    monkeypatch.setattr(hardware, "PRESET_DIR", presets)
    monkeypatch.setattr(hardware.load_preset, "__defaults__", (presets, None, 0))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        cli.precheck(["plan=true", "plan.hardware=mine", *PLAN_TINY])
    assert stopped.value.code == 2
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_this_machine_is_measured_once_then_read(tmp_path):
    cache = tmp_path / "cache"
    proc = plan_cli("plan=true", "strategy=ddp", "nprocs=2", *PLAN_TINY, cwd=tmp_path,
                    env={"HARNESS_MACHINE_CACHE": str(cache), "HARNESS_PLAN_CALIBRATION": "strategy",
                         "HARNESS_LINK_REPEATS": "3"})
    assert proc.returncode == 0, describe(proc)
    (machine,) = cache.glob("machine-*.json")
    measured = json.loads(machine.read_text())
    ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert set(measured["per_op"]) == ops | {f"{op}:bfloat16" for op in ops}
    assert all(link["bandwidth_gbps"] > 0 for link in measured["per_op"].values())
    # what a call adds after 1, 2, 4 and 8 ms of compute, each op's (its bfloat16 link the same), never less after more
    for op in ops:
        gaps = measured["per_op"][op]["after_compute"]
        assert [gap for gap, _ in gaps] == pytest.approx([0.001, 0.002, 0.004, 0.008])
        added = [seconds for _, seconds in gaps]
        assert added == sorted(added) and added[0] >= 0
        assert measured["per_op"][f"{op}:bfloat16"]["after_compute"] == gaps
    assert measured["rates"]["cpu:1"]["float32"] > 0
    (row,) = plan_json(tmp_path)["rows"]
    assert row["prediction"]["time"]["comm_s"] > 0
    assert "through strategy=ddp in a process group of one" in row["prediction"]["assumptions"][0]
    assert "measuring this machine's link" in proc.stdout


@pytest.mark.parametrize(("cached", "measured"), [(None, True), ("median", True), ("mean", True),
                                                  ("mean by size", True), ("mean by size, after compute", False)])
def test_a_sweep_measures_the_link_again_where_the_cached_one_was_taken_another_way(tmp_path, monkeypatch, cached,
                                                                                     measured):
    """Before a sweep's predictions (plan.predict): no link, or one of another statistic (the median before
    2026-12-05, the mean without its sizes before 2026-12-07, by size without what a call adds after compute) is
    measured; one as the planner takes it now is read. (A sweep once read any cached link: benchmark 15 ran an hour
    on a link with no sizes.)"""
    from harness import planning
    from harness.prediction import hardware

    monkeypatch.setenv("HARNESS_MACHINE_CACHE", str(tmp_path))
    if cached:
        hardware.write_machine({"link": {"latency_us": 400.0, "bandwidth_gbps": 1.5}, "link_statistic": cached})
    calls = []
    monkeypatch.setattr(planning, "local_target", lambda *args: calls.append(args))
    planning.ensure_link(2, False, 100)
    assert bool(calls) == measured
    planning.ensure_link(1, False, 100)  # one rank links nothing
    assert len(calls) == int(measured)


@pytest.mark.slow
def test_a_run_predicted_not_to_fit_is_skipped_with_the_reason(tmp_path):
    from conftest import run_cli

    proc, results = run_cli("strategy=single", "model=tiny_cnn", "data.image_size=512", "batch_size=4096",
                            "plan.predict=true", tmp_path=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert results["status"] == "skipped"
    assert results["error"].startswith("predicted peak ") and " GiB > " in results["error"]
    assert "(activations " in results["error"] and "plan.enforce=false" in results["error"]
    assert not (Path(results["_run_dir"]) / "ranks").exists()  # no worker started


@pytest.mark.xdist_group(SHARED_GROUP)
@pytest.mark.slow
def test_every_run_records_its_prediction_beside_the_measurement(shared_sweep):
    sweep, _ = shared_sweep
    results = json.loads((sweep / "0_single_O0" / "results.json").read_text())
    prediction, error = results["prediction"], results["prediction_error"]
    assert prediction["hardware"] == "local" and prediction["peak_mib"] > 0 and prediction["s_per_iteration"] > 0
    probed = max(r["tensor_peak_mib"] for r in results["ranks"])
    assert error["measured_peak_mib"] == probed and error["memory_source"] == "live-tensor-probe"
    assert error["peak_mib"] == pytest.approx((probed - prediction["peak_mib"]) / probed)  # over measured, not predicted
    measured_s = results["global_batch"] / results["throughput_img_s"]
    assert error["s_per_iteration"] == pytest.approx((measured_s - prediction["s_per_iteration"]) / measured_s)
    assert abs(error["peak_mib"]) < 0.10  # the traced step against the independent instrument


@pytest.mark.slow
def test_a_run_is_not_predicted_with_plan_predict_false(cli_run):
    _, results = cli_run(*SINGLE_RUN)  # the session's runs: HARNESS_PLAN_PREDICT=false (conftest)
    assert results["prediction"] is None and results["prediction_error"] is None
    assert results["ranks"][0]["tensor_peak_mib"] > 0  # the worker's probe measures all the same


@pytest.mark.xdist_group(SHARED_GROUP)
@pytest.mark.slow
def test_the_ddp_run_predicts_each_rank(shared_sweep):
    sweep, _ = shared_sweep
    results = json.loads((sweep / "1_ddp_O0" / "results.json").read_text())
    memory = results["prediction"]["memory"]
    assert [m["device"] for m in memory] == ["cpu:0", "cpu:1"] and memory[0]["comm_buffers_mib"] > 0
    assert all(r["tensor_peak_mib"] > 0 for r in results["ranks"])
    # The CPU probe is an upper bound (harness/core/tensor_peak.py): a block gloo's threads free goes unseen
    # unless its address is handed out again. On this 0.1 MiB peak the parameters' size (1562 floats, 6 KiB) is
    # 6 %, and such blocks (DDP's broadcast at construction, a bucket's all-reduce result) were measured above the
    # prediction once or twice from run to run (0.1057 or 0.1117 MiB against 0.0999): two are allowed above it,
    # beside 10 % either way (the global batch on each rank would be 60 % over; a bucket left out, 6 % under, is
    # tests/test_prediction_predict.py's to catch).
    error = results["prediction_error"]
    measured = error["measured_peak_mib"]
    predicted = measured * (1 - error["peak_mib"])  # unrounded (the per-rank rows are rounded to 0.01 MiB)
    unseen = 2 * 1562 * 4 / 2**20
    assert 0.9 * predicted < measured < 1.1 * predicted + unseen, (measured, predicted)


__all__ = ["TINY"]


def test_prediction_error_takes_the_largest_devices_reserved_peak_over_measured():
    """Hand-worked: two ranks on GPUs (the allocator's reserved peak, not allocated, the largest device, not the
    sum or rank 0's), and the relative error over the measurement, not over the prediction."""
    from harness.core.devices import AllocatorPeak
    from harness.core.rank_record import RankRecord
    from harness.core.results import RunRecord
    from harness.launch.runner import prediction_error

    def run(global_batch: int, throughput: float | None) -> RunRecord:
        return RunRecord(schema=2, status="ok", strategy="ddp", amp="O0", model="m", global_batch=global_batch,
                         throughput_img_s=throughput)

    records = [RankRecord(rank=0, allocator=[AllocatorPeak("cuda:0", 700.0, 800.0)]),
               RankRecord(rank=1, allocator=[AllocatorPeak("cuda:1", 900.0, 1000.0)], tensor_peak_mib=5.0)]
    error = prediction_error(900.0, 0.25, run(64, 320.0), records)  # 0.2 s per iteration
    assert error.measured_peak_mib == 1000.0 and error.memory_source == "torch-allocator"
    assert error.peak_mib == pytest.approx(0.10)  # (1000 - 900) / 1000, not / 900
    assert error.measured_s_per_iteration == pytest.approx(0.2)
    assert error.s_per_iteration == pytest.approx(-0.25)  # (0.2 - 0.25) / 0.2
    cpu = prediction_error(4.0, None, run(8, None),
                           [RankRecord(rank=0, tensor_peak_mib=4.5), RankRecord(rank=1, tensor_peak_mib=5.0)])
    assert cpu.measured_peak_mib == 5.0 and cpu.memory_source == "live-tensor-probe"
    assert cpu.s_per_iteration is None  # not predicted, or not measured: no error
