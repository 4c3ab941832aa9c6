"""On a real GPU: every path the CPU suite can only check against fakes. One GPU covers most of it;
multi-GPU cases say why they were skipped. Without CUDA every test is skipped with the reason.

Run through `bash scripts/gpu_check.sh` (docs/gpu.md): the figures each test records
with `record_property` land in pytest's JUnit XML, from which scripts/gpu_summary.py writes gpu-check.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not CUDA, reason=f"no CUDA GPU here (torch {torch.__version__}, built for CUDA {torch.version.cuda})")]


# tests/conftest.py's fixed figures of a machine (float16 at 0.01 TFLOP/s for every "cuda:N" key) and its
# in-process calibration are for the CPU suite's speed. On the H200 they reached these tests' runs through the
# environment, and a GPT's MFU came out as 877.7 (its FLOPs over that peak).
CPU_SUITE_SETTINGS = ("HARNESS_MACHINE_CACHE", "HARNESS_PLAN_CALIBRATION")


@pytest.fixture(scope="session", autouse=True)
def fixed_machine_figures() -> Iterable[None]:
    """Overrides tests/conftest.py's fixture of the same name for this module (a conftest.py here would shadow
    that one's helpers, imported as `conftest`): nothing fixed, the GPU's rates measured and kept in the user's
    cache. Runs are still predicted only where a test asks (plan.predict=true): each costs a GPU calibration."""
    previous = {key: os.environ.pop(key, None) for key in CPU_SUITE_SETTINGS}
    yield
    os.environ.update({key: value for key, value in previous.items() if value is not None})


def needs_gpus(n: int) -> pytest.MarkDecorator:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return pytest.mark.skipif(count < n, reason=f"needs {n} GPUs; {count} visible")

# Small enough for seconds per run, large enough that the GPU (not Python) sets the pace.
WORK = ("model=resnet18", "data.image_size=64", "batch_size=64", "iterations=60", "log_every=20")
TIMEOUT_S = 300


def run(*overrides: str, tmp_path: Path, env: dict[str, str] | None = None,
        ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "run.py", *overrides, f"hydra.run.dir={out}"], cwd=REPO,
                          capture_output=True, text=True, timeout=TIMEOUT_S, env={**os.environ, **(env or {})})
    path = out / "results.json"
    return proc, (json.loads(path.read_text()) if path.exists() else None)


def ok(proc: subprocess.CompletedProcess[str], results: dict[str, Any] | None) -> dict[str, Any]:
    assert results is not None, f"no results.json\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert results["status"] == "ok", (results["error"], proc.stderr[-3000:])
    assert proc.returncode == 0
    return results


# ---- precision on CUDA: float16 by default ------------------------------------------------------------

LEVELS = {  # level -> (master_weights, loss scale as resolved for float16)
    "O0": (False, 1.0), "O1": (False, "dynamic"), "O2": (True, "dynamic"), "O3": (False, 1.0),
}


@pytest.mark.parametrize("level", list(LEVELS))
def test_single_amp_levels_in_float16(tmp_path, record_property, level):
    r = ok(*run("strategy=single", f"amp={level}", *WORK, tmp_path=tmp_path))
    precision = r["precision"]
    masters, scale = LEVELS[level]
    assert precision["dtype"] == ("float32" if level == "O0" else "float16")
    assert precision["master_weights"] is masters and precision["loss_scale"] == scale
    assert isinstance(precision["skipped_steps"], int) and precision["skipped_steps"] >= 0
    assert all(math.isfinite(w["loss"]) for w in r["windows"])
    assert r["devices"] == ["cuda:0"] and r["memory"]["source"] == "nvml"
    record_property("img/s", r["throughput_img_s"])
    record_property("skipped steps", precision["skipped_steps"])
    record_property("final loss scale", precision["final_loss_scale"])


def test_o3_float16_with_dynamic_scaling(tmp_path, record_property):
    """Pure float16 weights, unscaled by the optimizer step itself (GradScaler refuses this by default)."""
    r = ok(*run("strategy=single", "amp=O3", "amp.loss_scale=dynamic", *WORK, tmp_path=tmp_path))
    assert r["precision"]["loss_scale"] == "dynamic" and r["precision"]["dtype"] == "float16"
    record_property("final loss scale", r["precision"]["final_loss_scale"])
    record_property("skipped steps", r["precision"]["skipped_steps"])


def test_kernel_choices_reach_cuda_and_channels_last_is_timed_beside_nchw(tmp_path, record_property):
    """kernels.*: the GPU defaults (cudnn.benchmark on, NHWC) and their opposite, side by side at O1; TF32 matmuls."""
    nhwc = ok(*run("strategy=single", "amp=O1", *WORK, tmp_path=tmp_path / "nhwc"))
    nchw = ok(*run("strategy=single", "amp=O1", "kernels.channels_last=false", "kernels.cudnn_benchmark=false",
                   "kernels.matmul_precision=high", *WORK, tmp_path=tmp_path / "nchw"))
    assert nhwc["kernels"] == {"cudnn_benchmark": True, "channels_last": True, "matmul_precision": "highest"}
    assert nchw["kernels"] == {"cudnn_benchmark": False, "channels_last": False, "matmul_precision": "high"}
    record_property("img/s NHWC + cudnn.benchmark", nhwc["throughput_img_s"])
    record_property("img/s NCHW, no benchmark", nchw["throughput_img_s"])


def test_a_language_model_reports_tokens_and_mfu_on_a_gpu(tmp_path, record_property):
    proc, results = run("strategy=single", "amp=O1", "model=gpt", "model.layers=4", "model.width=256",
                        "model.heads=4", "model.seq_len=256", "batch_size=16", "iterations=60", "plan.predict=true",
                        tmp_path=tmp_path)
    r = ok(proc, results)
    assert r["throughput_tokens_s"] == pytest.approx(r["throughput_img_s"] * 256)
    why = next((line for line in proc.stderr.splitlines() if "not predicted" in line), proc.stderr[-300:])
    assert r["prediction"] is not None, why
    assert "HARNESS_MACHINE_CACHE" not in os.environ  # the CPU suite's fixed figures (the fixture above)
    peak, flops = r["prediction"]["peak_tflops"], r["prediction"]["flops_per_iteration"]
    record_property("peak TFLOP/s", peak)  # H200, torch 2.11: MFU 877.7 once
    record_property("peak source", r["prediction"]["peak_source"])
    record_property("FLOPs per iteration", flops)
    assert r["mfu"] is not None and 0 < r["mfu"] < 1, r["notes"]
    # by hand: the FLOPs of an iteration times iterations per second, over one GPU's peak
    assert r["mfu"] == pytest.approx(flops * (r["throughput_img_s"] / 16) / (peak * 1e12), rel=1e-6)
    if any(name in torch.cuda.get_device_name(0) for name in ("H100", "H200")):  # dense float16: 989 on paper
        assert 150 < peak < 1000, f"{peak} TFLOP/s is no Hopper's float16 matmul rate"
    record_property("tokens/s", r["throughput_tokens_s"])
    record_property("MFU", r["mfu"])


# ---- strategies on one GPU ---------------------------------------------------------------------------

def test_ddp_world_size_1_on_nccl(tmp_path, record_property):
    r = ok(*run("strategy=ddp", "gpus=[0]", *WORK, tmp_path=tmp_path))
    assert r["world_size"] == 1 and [x["backend"] for x in r["ranks"]] == ["nccl"]
    worker = r["ranks"][0]["pid"]
    assert worker != r["launcher_pid"]
    holders = {p["pid"]: p.get("nvml_pid") for p in r["memory"]["per_process"] if p["role"] == "rank"}
    record_property("worker PID seen by NVML as", holders.get(worker, "not seen") or worker)
    assert worker in holders, r["memory"]["per_process"]  # its own, or NVML's host PID matched to it
    assert not [p for p in r["memory"]["per_process"] if p["role"] in ("other", "unmatched")]
    record_property("img/s", r["throughput_img_s"])


def test_dataparallel_on_one_gpu_is_a_baseline(tmp_path, record_property):
    proc, results = run("strategy=dp", "gpus=[0]", *WORK, tmp_path=tmp_path)
    r = ok(proc, results)
    assert r["devices"] == ["cuda:0"] and any("one-GPU baseline" in n for n in r["notes"])
    record_property("img/s", r["throughput_img_s"])


def test_memory_one_device_report(tmp_path, record_property):
    from harness.core.results import from_dict
    from harness.memory import imbalance

    r = ok(*run("strategy=single", *WORK, tmp_path=tmp_path))
    report = imbalance.analyze(from_dict(r))
    assert report.verdict.startswith("one device (cuda:0")
    record_property("layout", report.layout)
    record_property("verdict", report.verdict)


def test_nvml_agrees_with_the_allocator(tmp_path, record_property):
    """NVML's peak on the GPU (minus what was there before) holds the allocator's reserved peak plus the
    CUDA context and library workspaces: at least the reserved peak, and not much more. With cudnn.benchmark
    off: its trials reserve workspaces for milliseconds and hand them back (on an H200, 2920 MiB reserved at
    its peak against 1804 MiB that NVML's 100-ms samples saw), which the allocator's peak counts and a sampler
    cannot be relied on to see."""
    r = ok(*run("strategy=ddp", "gpus=[0]", "kernels.cudnn_benchmark=false", *WORK, tmp_path=tmp_path))
    device = r["memory"]["per_device"][0]
    nvml_used = device["peak_mib"] - device["baseline_mib"]
    reserved = r["ranks"][0]["allocator"][0]["max_reserved_mib"]
    record_property("NVML peak - baseline MiB", nvml_used)
    record_property("allocator max reserved MiB", reserved)
    record_property("context + workspaces MiB", nvml_used - reserved)
    per_pid = {p["pid"]: p["peak_mib"] for p in r["memory"]["per_process"]}
    record_property("per-PID MiB", per_pid)
    assert nvml_used >= reserved
    assert nvml_used - reserved < 2048, "more than 2 GiB beyond the allocator: a stray context?"
    rank_pid = r["ranks"][0]["pid"]
    assert rank_pid in per_pid, per_pid  # matched to NVML's host PID where a container hides it
    assert per_pid[rank_pid] is not None and reserved <= per_pid[rank_pid] <= nvml_used + 1


def test_window_times_agree_with_cuda_events(record_property):
    """The harness's window clock (perf_counter between device syncs) against CUDA events recorded at the
    same edges: within 2 %."""
    from amp import build_amp
    from harness.core.amp_levels import AmpConfig, plugin_path, resolve
    from harness.core.timing import WindowClock
    from harness.rank.data import SyntheticSource
    from harness.rank.models import torchvision_model
    from harness.rank.trainer import train

    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torchvision_model("resnet50", num_classes=100).to(device)
    spec = resolve(AmpConfig(level="O0"), "cuda")
    precision = build_amp(plugin_path(spec.impl), spec, device)
    model = precision.cast_module(model)  # the amp plugin's phases, as Strategy.setup_module runs them
    model, optimizer = precision.connect(model, torch.optim.SGD(precision.optimizer_params(model), lr=0.01,
                                                                momentum=0.9))
    batch = (torch.randn(64, 3, 128, 128, device=device), torch.randint(0, 100, (64,), device=device))
    events: list[torch.cuda.Event] = []

    def sync_with_event() -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        events.append(event)
        torch.cuda.synchronize(device)

    clock = WindowClock(sync_with_event, warmup_windows=1)
    train(model, optimizer, precision, SyntheticSource([batch]), clock, iterations=120, log_every=20)
    host = [w.seconds for w in clock.windows[1:]]
    gpu = [events[i].elapsed_time(events[i + 1]) / 1000 for i in range(1, len(events) - 1)]
    worst = max(abs(h - g) / g for h, g in zip(host, gpu, strict=True))
    record_property("steady windows host s", [round(h, 4) for h in host])
    record_property("same windows CUDA events s", [round(g, 4) for g in gpu])
    record_property("worst difference %", 100 * worst)
    assert worst < 0.02


def test_an_induced_out_of_memory_is_recorded_as_oom_with_its_peaks(tmp_path, record_property):
    proc, r = run("strategy=ddp", "gpus=[0]", *WORK, "fault.kind=oom", "fault.at_iter=30", tmp_path=tmp_path)
    assert proc.returncode == 1 and r is not None
    assert r["status"] == "oom", r["error"]
    assert [w["end_iter"] for w in r["windows"]] == [20]
    allocator = r["ranks"][0]["allocator"]
    assert allocator and allocator[0]["max_reserved_mib"] > 0
    assert r["memory"]["per_device"][0]["peak_mib"] > 0
    record_property("error", r["error"][:120])
    record_property("allocator max reserved MiB", allocator[0]["max_reserved_mib"])


def test_fork_is_refused_on_gpus(tmp_path):
    proc, r = run("strategy=ddp", "gpus=[0]", "launcher=spawn", "launcher.start_method=fork", *WORK,
                  tmp_path=tmp_path)
    assert proc.returncode == 2 and r is None
    assert proc.stderr.strip().startswith("error: launcher.start_method=fork is not allowed")


def test_gpu_chosen_by_uuid_is_the_gpu_used(tmp_path, record_property):
    """CUDA_VISIBLE_DEVICES=<GPU 0's UUID>: the run uses that GPU and NVML reads that GPU."""
    import pynvml

    pynvml.nvmlInit()
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    pynvml.nvmlShutdown()
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    r = ok(*run("strategy=ddp", *WORK, tmp_path=tmp_path, env={"CUDA_VISIBLE_DEVICES": uuid}))
    assert r["devices"] == ["cuda:0"] and r["memory"]["source"] == "nvml"
    assert r["memory"]["per_device"][0]["peak_mib"] > r["memory"]["per_device"][0]["baseline_mib"]
    record_property("uuid", uuid)


def test_collectives_benchmark_on_one_gpu(tmp_path, record_property):
    out = tmp_path / "coll"
    proc = subprocess.run([sys.executable, "-m", "harness.collectives", "gpus=[0]",
                           "collectives.sizes=[4KiB,1MiB,64MiB]", f"hydra.run.dir={out}"], cwd=REPO,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "collectives.json").read_text())
    assert results["status"] == "ok" and results["backend"] == "nccl" and results["world_size"] == 1
    assert "at least 2 ranks" in results["unsupported"]["sendrecv"]
    record_property("all_reduce 64 MiB µs", next(r["time_us"] for r in results["rows"]
                                      if r["op"] == "all_reduce" and r["size_bytes"] == 64 * 2**20))


# ---- NVIDIA apex 25.05, where a source tree was carried and built python-only ----------------------------

def apex_missing() -> str | None:
    from harness.core.optional import apex_missing as missing

    return missing("amp")


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_apex_amp(tmp_path, record_property, level):
    if apex_missing():
        pytest.skip(apex_missing())
    r = ok(*run("strategy=single", f"amp={level}", "amp.impl=apex", *WORK, tmp_path=tmp_path))
    assert r["precision"]["impl"] == "apex"
    record_property("img/s", r["throughput_img_s"])
    record_property("final loss scale", r["precision"]["final_loss_scale"])


def test_apex_ddp_world_size_1(tmp_path, record_property):
    from harness.core.optional import apex_missing as missing

    if missing("parallel"):
        pytest.skip(missing("parallel"))
    r = ok(*run("strategy=apex_ddp", "gpus=[0]", *WORK, tmp_path=tmp_path))
    record_property("img/s", r["throughput_img_s"])


# ---- several GPUs ------------------------------------------------------------------------------------

@needs_gpus(2)
def test_ddp_on_two_gpus_one_pid_per_gpu(tmp_path, record_property):
    r = ok(*run("strategy=ddp", "gpus=[0,1]", *WORK, tmp_path=tmp_path))
    ranks = [p for p in r["memory"]["per_process"] if p["role"] == "rank"]
    assert len({p["pid"] for p in ranks}) == 2 and {p["device"] for p in ranks} == {"cuda:0", "cuda:1"}
    record_property("img/s", r["throughput_img_s"])


@needs_gpus(2)
def test_dataparallel_on_two_gpus_one_pid_on_both_and_a_heavier_base(tmp_path, record_property):
    from harness.core.results import from_dict
    from harness.memory import imbalance

    r = ok(*run("strategy=dp", "gpus=[0,1]", *WORK, tmp_path=tmp_path))
    report = imbalance.analyze(from_dict(r))
    assert report.layout.startswith("one PID") and "every device" in report.layout
    record_property("base excess %", report.base_excess_pct)
    record_property("verdict", report.verdict)


# ---- where the time goes, and what the GPU did (profile=true, data=loader, NVML activity) -------------------

def check_breakdown(r: dict[str, Any], record_property: Any) -> dict[str, Any]:
    """The device view's parts add up to the profiled window; NVML's activity is a figure or says why not."""
    run = r["profile"]["run"]
    own = next(w for w in r["per_rank_windows"][str(run["rank"])] if w["profiled"])
    assert run["view"] == "device", "no GPU kernels in the trace: was CUDA activity recorded?"
    assert sum(run["parts_s"].values()) == pytest.approx(run["span_s"], rel=1e-9)
    assert run["span_s"] == pytest.approx(own["seconds"], rel=0.05)
    assert run["parts_s"]["compute"] > 0
    for device in r["gpu_activity"]["per_device"]:
        for key in ("utilization_pct", "sm_clock_mhz", "power_w", "energy_j"):
            assert device[key] is not None or f"{device['device']} {key}" in r["gpu_activity"]["unavailable"], key
    record_property("shares", {k: round(v, 3) for k, v in run["shares"].items()})
    record_property("communication total / overlapped ms", (round(1000 * run["communication_total_s"], 2),
                                                            round(1000 * run["communication_overlapped_s"], 2)))
    record_property("profiled window slowdown", r["profile"]["slowdown"])
    record_property("gpu activity", r["gpu_activity"]["per_device"])
    record_property("unavailable", r["gpu_activity"]["unavailable"])
    record_property("J/image", r["energy_j_per_image"])
    energy = r["energy_j_per_image"]
    if energy is not None:  # the energy counter's rise over the images against the mean power over their time
        implied_w = energy * r["throughput_img_s"]  # J/image × images/s: watts, summed over the run's GPUs
        assert 30 < implied_w < 1500, f"{energy} J/image at {r['throughput_img_s']} img/s is {implied_w:.0f} W"
        power = sum(d["power_w"] for d in r["gpu_activity"]["per_device"] if d["power_w"] is not None)
        if power and r["gpu_activity"]["readings"] >= 3:
            assert implied_w == pytest.approx(power, rel=0.5)
    record_property("data wait share", r["data_wait_share"])
    return run


def test_profile_breakdown_energy_and_loader_on_one_gpu(tmp_path, record_property):
    r = ok(*run("strategy=single", "data=loader", "data.num_workers=2", "profile=true", *WORK, tmp_path=tmp_path))
    check_breakdown(r, record_property)
    assert r["data_wait_share"] is not None
    data = [p for p in r["memory"]["per_process"] if p["role"] == "data"]
    assert len(data) == 2 and all(p["device"] == "cuda:0" and p["peak_mib"] > 0 for p in data)  # host memory
    assert (tmp_path / "run" / "traces" / "rank0.json").exists()


@needs_gpus(2)
def test_profile_ddp_on_two_gpus_shows_nccl_communication(tmp_path, record_property):
    r = ok(*run("strategy=ddp", "gpus=[0,1]", "profile=true", *WORK, tmp_path=tmp_path))
    run_part = check_breakdown(r, record_property)
    # NCCL kernels found and classified: a 45 MB gradient all-reduce per step is no rounding error
    assert 0.01 * run_part["span_s"] < run_part["communication_total_s"] <= run_part["span_s"]


@needs_gpus(2)
def test_profile_dataparallel_on_two_gpus_shows_its_copies_as_communication(tmp_path, record_property):
    r = ok(*run("strategy=dp", "gpus=[0,1]", "profile=true", *WORK, tmp_path=tmp_path))
    run_part = check_breakdown(r, record_property)
    # Broadcast/Scatter/Gather's copies of the weights and the batch, every step
    assert 0.01 * run_part["span_s"] < run_part["communication_total_s"] <= run_part["span_s"]
