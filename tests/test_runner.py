"""harness.launch.runner: what is decided before launch (refusals, fresh processes), how the memory section falls
back, and to whom an error is attributed."""

from __future__ import annotations

import os
from dataclasses import MISSING, fields
from typing import Any

import pytest
from conftest import run_config
from test_memory import FakeNvml, mib

from harness.core.config import RunConfig
from harness.core.devices import AllocatorPeak
from harness.core.errors import Incompatible
from harness.core.rank_record import RankRecord
from harness.core.results import DeviceMemory, Precision, RunRecord
from harness.core.timing import Window
from harness.launch.decide import run_plan as plan
from harness.launch.placement import Hardware
from harness.launch.runner import measured, memory_section, planned
from harness.memory.sampler import MemorySampler, NvmlSource

ONE_GPU = Hardware(visible_gpus=(0,), cores=8)
TWO_GPUS = Hardware(visible_gpus=(0, 1), cores=8)
cfg_for = run_config


@pytest.mark.parametrize("level", ["O0", "O2", "O3"])
def test_dataparallel_with_apex_amp_that_patches_forward_is_refused(level):
    with pytest.raises(Incompatible) as info:
        plan(cfg_for("dp", amp={"level": level, "impl": "apex"}), TWO_GPUS)
    assert info.value.key == "amp.impl" and "replica" in str(info.value)


def test_dataparallel_with_apex_o1_is_allowed():
    assert plan(cfg_for("dp", amp={"level": "O1", "impl": "apex"}), TWO_GPUS).placement.nprocs == 1


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_apex_ddp_with_bfloat16_weights_is_refused(level):
    with pytest.raises(Incompatible) as info:
        plan(cfg_for("apex_ddp", amp={"level": level, "dtype": "bfloat16"}), TWO_GPUS)
    assert info.value.key == "amp.dtype" and "bfloat16" in str(info.value)
    # float16 weights, or bfloat16 only inside autocast (O1, fp32 weights), are what apex DDP reduces
    plan(cfg_for("apex_ddp", amp={"level": level, "dtype": "float16"}), TWO_GPUS)
    plan(cfg_for("apex_ddp", amp={"level": "O1", "dtype": "bfloat16"}), TWO_GPUS)


def test_fork_is_refused_with_cuda_and_allowed_on_cpu():
    fork = {"name": "spawn", "start_method": "fork"}
    with pytest.raises(Incompatible) as info:
        plan(cfg_for("ddp", launcher=fork, batch_size=2), TWO_GPUS)
    assert info.value.key == "launcher.start_method" and "CUDA" in str(info.value)
    assert plan(cfg_for("ddp", launcher=fork, gpus=[], batch_size=2), TWO_GPUS).placement.accelerator == "cpu"
    assert plan(cfg_for("ddp", launcher={"name": "spawn", "start_method": "forkserver"}, batch_size=2), TWO_GPUS)


@pytest.mark.parametrize(("strategy", "repeat", "in_sweep", "launched"), [
    ("single", 1, False, False),  # a single run of a one-process strategy runs inside the launcher
    ("single", 2, False, True),  # repeats: each in a fresh process (no inherited CUDA context or cached blocks)
    ("single", 1, True, True),
    ("dp", 3, False, True),
    ("ddp", 1, False, True),
])
def test_which_runs_get_fresh_processes(strategy, repeat, in_sweep, launched):
    decided = plan(cfg_for(strategy, repeat=repeat), ONE_GPU, in_sweep=in_sweep)
    assert decided.launched is launched
    assert decided.placement.torch_indices == (0,)


def test_memory_falls_back_to_the_allocator_when_nvml_took_no_sample():
    """NVML opened, then every query refused (MIG without privileges): before, results said 0 MiB from nvml."""
    fake = FakeNvml(used={0: mib(100)}, procs={}, deny=("memory",))
    sampler = MemorySampler(NvmlSource([0], nvml=fake), interval_s=3600).start()
    sampler.stop()
    records = [RankRecord(rank=0, pid=11, device="cuda:0", host="h",
                          allocator=[AllocatorPeak("cuda:0", max_allocated_mib=700.0, max_reserved_mib=812.5)])]
    memory = memory_section(sampler, ("cuda:0",), records, os.getpid(), None)
    assert memory.source == "torch-allocator"
    assert memory.per_device == [DeviceMemory(device="cuda:0", peak_mib=812.5, baseline_mib=0.0)]
    assert memory.warning and "Insufficient Permissions" in memory.warning


def windows(seconds: list[float], every: int = 20) -> list[Window]:
    out, cumulative = [], 0.0
    for i, s in enumerate(seconds):
        cumulative += s
        out.append(Window(end_iter=every * (i + 1), seconds=s, cumulative_seconds=cumulative, warmup=i == 0, loss=1.0))
    return out


def test_throughput_counts_the_global_batch_over_the_slowest_rank():
    """2 ranks of 4 images (global batch 8), windows of 20 iterations; the run's clock is the slower rank:
    cumulative 2, 3, 4 s -> steady 2 windows in 2 s -> 8 x 20 x 2 / 2 = 160 img/s (per-rank batch: 80)."""
    cfg = run_config("ddp", batch_size=8, iterations=60)
    decided = plan(cfg, Hardware(visible_gpus=(), cores=4))
    records = [RankRecord(rank=0, windows=windows([1.5, 1.0, 1.0])), RankRecord(rank=1, windows=windows([2.0, 1.0, 1.0]))]
    m = measured(planned(decided, None), decided, records, started=0.0)
    assert decided.placement.local_batch == 4
    assert [w.cumulative_seconds for w in m.windows] == [2.0, 3.0, 4.0]
    assert m.throughput_img_s == pytest.approx(160.0)


def test_compile_time_is_the_slowest_ranks_and_comes_out_of_startup():
    """torch.compile runs on every rank side by side before the clock: the run waited for the slowest (5 s, not
    2 s), and start-up (first iteration 9 s after the start) is 9 - 5 = 4 s without it."""
    cfg = run_config("ddp", batch_size=8, iterations=60)
    decided = plan(cfg, Hardware(visible_gpus=(), cores=4))
    records = [RankRecord(rank=r, windows=windows([1.5, 1.0, 1.0]), first_iter_time=9.0 - r, compile_seconds=seconds)
               for r, seconds in ((0, 5.0), (1, 2.0))]
    m = measured(planned(decided, None), decided, records, started=0.0)
    assert m.compile_seconds == 5.0
    assert m.startup_seconds == pytest.approx(9.0 - 5.0)


def test_an_unreadable_rank_record_is_named_not_dropped_silently(tmp_path, caplog):
    from harness.launch.runner import read_records

    (tmp_path / "rank0.json").write_text('{"rank": 0, "status": "ok"}')
    (tmp_path / "rank3.json").write_text('{"rank": 3, "statuss": "ok"}')  # a key the record lacks: unreadable too
    (tmp_path / "rank1.json").write_text('{"rank": 1, "sta')
    (tmp_path / ".rank2.json.abc.tmp").write_text('{"ra')  # a write cut short: never read
    assert read_records(tmp_path) == [RankRecord(rank=0, status="ok")]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and all("unreadable" in w for w in warnings)
    assert str(tmp_path / "rank1.json") in warnings[0] and str(tmp_path / "rank3.json") in warnings[1]


def test_a_driver_that_will_not_describe_itself_is_said_so():
    from harness.launch.runner import _describe_source

    class Source:
        def describe(self):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    described = _describe_source(Source())
    assert described["driver"] is None and "NVML_ERROR_NOT_SUPPORTED" in described["describe_error"]


def test_the_root_cause_is_the_first_rank_to_fail_not_its_neighbours():
    """Rank 1 raised at t=10; rank 0's collective broke at t=12 because of it; rank 2 ended fine."""
    from harness.launch.runner import run_status

    records = [RankRecord(rank=0, pid=10, status="failed", error="RuntimeError: Connection closed by peer",
                          ended_at=12.0),
               RankRecord(rank=1, pid=11, status="oom", error="OutOfMemoryError: CUDA out of memory", ended_at=10.0),
               RankRecord(rank=2, pid=12, status="ok", error=None, ended_at=13.0)]
    assert run_status(records, [], None) == ("oom", "rank 1 (pid 11): OutOfMemoryError: CUDA out of memory")


@pytest.mark.slow
def test_the_records_are_read_only_once_every_started_rank_has_ended(tmp_path):
    """A rank the launcher lost track of (its fork server killed by a job-wide signal) is waited for by its pid
    file; a pid file whose start time does not match the live process (a reused PID) is not waited for."""
    import subprocess
    import sys
    import time

    import psutil

    from harness.launch.runner import await_ranks

    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.8)"])
    started = psutil.Process(late.pid).create_time()
    (tmp_path / "rank1.pid").write_text(f"{late.pid} {started}")
    begun = time.monotonic()
    await_ranks(tmp_path, grace_s=10)
    assert time.monotonic() - begun >= 0.5 and late.poll() is not None  # it ended; we did not kill it
    assert late.returncode == 0
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / "rank1.pid").write_text(f"{other.pid} {psutil.Process(other.pid).create_time() - 100}")
        begun = time.monotonic()
        await_ranks(tmp_path, grace_s=5)
        assert time.monotonic() - begun < 1 and other.poll() is None  # not ours: neither waited for nor killed
    finally:
        other.kill()
        other.wait()


def test_the_phases_add_up_to_the_runs_wall_time_when_different_ranks_are_slow_at_different_stages():
    """Hand-worked: rank 0 is slow to import (2 -> 5), rank 1 slow to join and build (4 -> 6.5 -> 9). Each phase
    runs from the last rank's previous stamp to the last rank's own, so they add up to the 23 s the run took
    (the slowest rank's span per phase, as before, counted imports 3 s and the process group 2.5 s: 26 s in all)."""
    from harness.core.rank_record import RankTimes
    from harness.launch.runner import phases

    records = [RankRecord(rank=0, first_iter_time=8.0, ended_at=21.0,
                          times=RankTimes(process_started=2.0, entered=5.0, group_ready=6.0, built=7.0, loop_ended=20.0)),
               RankRecord(rank=1, first_iter_time=9.5, ended_at=21.5,
                          times=RankTimes(process_started=3.0, entered=4.0, group_ready=6.5, built=9.0, loop_ended=19.0))]
    got = phases(0.0, 1.0, 22.0, 23.0, records, launched=True, compile_seconds=None)
    assert got == {"prepare": 1.0, "process_start": 2.0, "imports": 2.0, "process_group": 1.5, "build": 2.5,
                   "to_first_iteration": 0.5, "windows": 10.5, "after_loop": 1.5, "teardown": 0.5, "results": 1.0}
    assert sum(got.values()) == pytest.approx(23.0)
    compiled = phases(0.0, 1.0, 22.0, 23.0, records, launched=True, compile_seconds=0.25)
    assert compiled["to_first_iteration"] == 0.25  # compile time is its own figure, out of start-up


def test_mfu_is_the_global_steps_flops_at_the_measured_pace_over_every_devices_peak():
    """Worked by hand (a 2-block GPT here, docs/workloads.md): 402,653,184 FLOPs per iteration of the global
    batch of 8 at 1199.24 samples/s is 149.9 iterations/s, 6.036e10 FLOP/s; one device's peak 0.2544 TFLOP/s gives
    23.7 %. Two devices of that peak halve it (not the per-rank batch, not one device's peak)."""
    from harness.launch.runner import model_flops_utilisation

    assert model_flops_utilisation(402_653_184, 0.2544, 1199.24, 8, 1) == pytest.approx(0.2373, abs=1e-4)
    assert model_flops_utilisation(402_653_184, 0.2544, 1199.24, 8, 2) == pytest.approx(0.2373 / 2, abs=1e-4)
    assert model_flops_utilisation(None, 0.2544, 1199.24, 8, 1) is None  # not predicted: no FLOPs counted


def test_an_mfu_above_the_peak_is_refused_with_the_peak_it_was_divided_by():
    from harness.launch.runner import plausible_mfu

    assert plausible_mfu(0.2373, 0.2544, "local") == (0.2373, None)
    assert plausible_mfu(1.0, 0.2544, "local") == (1.0, None)
    assert plausible_mfu(None, None, "") == (None, None)
    mfu, why = plausible_mfu(877.7, 0.04631, "local: this machine's measured GEMM rate, float16")
    assert mfu is None
    assert why == ("MFU not reported: the run computed 87770% of the peak 0.04631 TFLOP/s (local: this machine's "
                   "measured GEMM rate, float16), so that peak is wrong")


# ---- results.json assembled typed: the plan's record, then what was measured; each default of RunRecord once ----

# What the plan decides (harness.launch.runner.planned); every other field keeps RunRecord's default until measured
PLANNED = {"schema", "status", "strategy", "amp", "model", "launcher", "devices", "accelerator", "world_size", "nodes",
           "global_batch", "local_batch", "image_size", "sample", "tokens_per_sample", "iterations",
           "iterations_requested", "log_every", "warmup_windows", "threads_per_process", "notes", "precision",
           "launcher_pid", "overrides", "config", "started_at", "strategy_options", "variant", "compile", "grad_accum"}
# results.json's keys, in their order, before the record was assembled typed (a run of this harness, issue 53)
WRITTEN_KEYS = [
    "schema", "status", "strategy", "amp", "model", "error", "provisional", "launcher", "devices", "accelerator",
    "world_size", "nodes", "global_batch", "local_batch", "image_size", "iterations", "iterations_requested",
    "stopped_by", "log_every", "warmup_windows", "threads_per_process", "notes", "precision", "windows",
    "per_rank_windows", "throughput_img_s", "sample", "tokens_per_sample", "throughput_tokens_s", "mfu", "kernels",
    "data_wait_share", "profile", "gpu_activity", "energy_j_per_image", "startup_seconds", "command_startup_seconds",
    "compile_seconds", "compile_cache", "ranks", "memory", "memory_theory", "parity", "launcher_pid", "overrides",
    "config", "strategy_options", "variant", "compile", "grad_accum", "env", "started_at", "finished_at", "round",
    "place", "after", "phases", "machine", "prediction", "prediction_error"]
WRITTEN_PARTS = {
    "precision": ["level", "impl", "dtype", "master_weights", "keep_batchnorm_fp32", "loss_scale", "final_loss_scale",
                  "skipped_steps"],
    "kernels": ["cudnn_benchmark", "matmul_precision", "channels_last"],
    "memory": ["source", "samples", "per_device", "per_process", "warning"],
    "memory_theory": ["params_mib", "grads_mib", "optimizer_state_mib", "master_weights_mib", "total_mib",
                      "world_size", "sharded", "whole_bytes"],
    "env": ["torch", "torch_built_for_cuda", "cuda_available", "cpu", "cpu_capability", "cpu_native_half", "python",
            "hostname", "platform", "command", "harness_commit", "driver", "gpu_names", "packages", "launcher",
            "describe_error"],
    "machine": ["cores", "load_before", "others_cpu_s", "windows_s", "others_gpu_util_pct", "busy", "reason"],
}


def _default(f: Any) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _single_plan(**values: Any) -> Any:
    from conftest import config_dict

    cfg = config_dict("single", nprocs=1, batch_size=8, **values)
    return plan(RunConfig.from_dict(cfg, "single"), Hardware(visible_gpus=(), cores=2), resolved=cfg)


def test_the_plans_record_leaves_every_other_field_at_runrecords_default():
    decided = _single_plan()
    record = planned(decided, ["strategy=single"])
    assert {f.name for f in fields(RunRecord) if getattr(record, f.name) != _default(f)} <= PLANNED
    assert (record.status, record.strategy, record.amp, record.model) == ("failed", "single", "O0", "tiny_cnn")
    assert (record.world_size, record.global_batch, record.local_batch, record.nodes) == (1, 8, 8, 1)
    assert (record.iterations, record.iterations_requested, record.overrides) == (40, 40, ["strategy=single"])
    assert record.precision == Precision(level="O0", impl="native", dtype="float32", master_weights=False,
                                         keep_batchnorm_fp32=True, loss_scale=1.0)
    assert (record.variant, record.compile, record.grad_accum, record.strategy_options) == ("", False, 1, {})
    # measured from no rank: still nothing but defaults beyond the plan (and the precision's outcome unknown)
    empty = measured(record, decided, [], started=0.0)
    assert {f.name for f in fields(RunRecord) if getattr(empty, f.name) != _default(f)} <= PLANNED
    assert record.to_dict() == record.checked().to_dict()  # as written is as read back


def test_no_default_of_a_record_is_written_again_where_results_are_assembled():
    """Where results.json is put together (the runner, torchrun): no mapping keyed by RunRecord's field names (the
    record is built typed), and no keyword argument to a record, or to `replace`, that restates its default."""
    import ast
    from dataclasses import is_dataclass
    from pathlib import Path

    from harness.core import results as records

    classes = {name: cls for name, cls in vars(records).items()
               if isinstance(cls, type) and is_dataclass(cls) and cls.__module__ == records.__name__}
    run_fields = {f.name for f in fields(RunRecord)}

    def default_of(cls: type, name: str) -> Any:
        found = {f.name: f for f in fields(cls)}.get(name)
        return MISSING if found is None else _default(found)

    def literal(node: ast.expr) -> Any:
        try:
            return ast.literal_eval(node)
        except ValueError:
            return MISSING

    found = []
    for module in ("harness/launch/runner.py", "harness/launch/torchrun.py"):
        tree = ast.parse((Path(__file__).resolve().parents[1] / module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)} & run_fields
                if keys:
                    found.append(f"{module}:{node.lineno}: a mapping keyed {sorted(keys)}")
            if isinstance(node, ast.Call):
                callee = node.func.id if isinstance(node.func, ast.Name) else None
                owners = [classes[callee]] if callee in classes else list(classes.values()) if callee == "replace" \
                    else []
                for keyword in node.keywords:
                    value = literal(keyword.value)
                    if keyword.arg and value is not MISSING and any(
                            default_of(cls, keyword.arg) is not MISSING and value == default_of(cls, keyword.arg)
                            and type(value) is type(default_of(cls, keyword.arg)) for cls in owners):
                        found.append(f"{module}:{node.lineno}: {callee}({keyword.arg}={value!r}) is its default")
    assert not found, "\n".join(found)


def test_a_run_writes_the_keys_it_wrote_before_its_record_was_typed(tmp_path):
    """A tiny run in this process (harness.launch.runner.execute): results.json's keys and their order, and those of
    its parts, as the dict-built record wrote them; what the plan decides, as it decided it."""
    import json

    from harness.launch.runner import execute

    decided = _single_plan(memory={"enabled": True, "interval_ms": 50})
    record = execute(decided, tmp_path, in_sweep=False, overrides=["strategy=single", "nprocs=1"])
    written = json.loads((tmp_path / "results.json").read_text())
    assert list(written) == WRITTEN_KEYS
    for part, keys in WRITTEN_PARTS.items():
        assert list(written[part]) == keys, part
    assert list(written["ranks"][0]) == ["rank", "local_rank", "pid", "host", "device", "backend", "status", "error",
                                         "allocator", "tensor_peak_mib", "params_held_mib"]
    assert list(written["windows"][0]) == ["end_iter", "seconds", "cumulative_seconds", "warmup", "loss",
                                           "data_wait_s", "profiled"]
    assert written["status"] == "ok" and written["error"] is None and record.to_dict() == written
    assert written["memory"]["source"] == "psutil" and written["memory"]["per_process"][0]["role"] == "rank"
    assert (written["world_size"], written["global_batch"], written["iterations"], written["nodes"]) == (1, 8, 40, 1)
    assert written["launcher"] == "elastic/forkserver" and written["devices"] == ["cpu"]
    assert written["precision"]["skipped_steps"] == 0 and written["throughput_img_s"] > 0
    assert list(written["phases"]) == ["prepare", "process_group", "build", "to_first_iteration", "windows",
                                       "after_loop", "teardown", "results"]
    assert written["prediction"] is None and written["prediction_error"] is None and written["provisional"] is False
