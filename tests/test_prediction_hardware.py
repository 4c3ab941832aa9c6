"""Hardware presets (harness.prediction.hardware): every shipped one loads; bad ones are refused naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.errors import ConfigError
from harness.prediction.hardware import LOCAL, PRESET_DIR, load_preset, preset_names

GOOD = """accelerator: cuda
devices_per_node: 4
nodes: 1
device_memory_gib: 24
memory_gbps: 900
peak_tflops: {float32: 10, bfloat16: 100, float16: 100}
intra: {latency_us: 3, bandwidth_gbps: 20}
inter: {latency_us: 10, bandwidth_gbps: 5}
"""


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(text)
    return folder


def test_every_shipped_preset_loads_with_its_figures():
    names = preset_names()
    assert {"local", "h100x8", "h100x16-ib", "a100x8", "a100x16-25gbe"} <= set(names)
    h100 = load_preset("h100x8")
    assert (h100.accelerator, h100.devices, h100.nodes) == ("cuda", 8, 1)
    assert h100.peak_tflops["bfloat16"] > h100.peak_tflops["tf32"] > h100.peak_tflops["float32"] > 0
    assert h100.memory_gbps == 3350 and load_preset("a100x8").memory_gbps == 2039  # datasheets, as the files say
    assert "tf32" not in load_preset("v100x8").peak_tflops  # no TF32 before Ampere
    ib = load_preset("h100x16-ib")
    # a ring across nodes moves the node's 8 NICs at once (one ring per rail): NVLink's bus bandwidth bounds it
    assert ib.devices == 16 and ib.inter.bandwidth_gbps <= ib.intra.bandwidth_gbps and ib.inter.bandwidth_gbps > 100
    # the published kernel benchmarks: an H100's matmuls reach a smaller share of its peak than an A100's (MAMF),
    # its FlashAttention-2 far less (35 % against 73 %); a preset without one keeps the datasheet
    a100 = load_preset("a100x8")
    assert h100.kernel_share["matmul"] < a100.kernel_share["matmul"] < 1
    assert h100.kernel_share["attention"] < a100.kernel_share["attention"]
    assert load_preset("v100x8").kernel_share == {}
    slow = load_preset("a100x16-25gbe")
    assert slow.inter.bandwidth_gbps < 4  # 25 Gb/s is 3.1 GB/s


@pytest.mark.parametrize(("share", "field"), [("{matmul: 1.2}", "kernel_share.matmul"),
                                               ("{conv: 0.5}", "kernel_share"), ("0.8", "kernel_share")])
def test_a_kernel_share_outside_its_classes_or_range_is_refused(tmp_path, share, field):
    folder = write(tmp_path / "presets", "mine", GOOD + f"kernel_share: {share}\n")
    with pytest.raises(ConfigError) as caught:
        load_preset("mine", preset_dir=folder)
    assert f"`{field}`" in str(caught.value)


def test_local_takes_the_measured_fields():
    machine = {"accelerator": "cpu", "devices_per_node": 2, "nodes": 1, "device_memory_gib": 24.0, "memory_gbps": 9.0,
               "peak_tflops": {"float32": 0.1, "bfloat16": 0.2, "float16": 0.01},
               "intra": {"latency_us": 900.0, "bandwidth_gbps": 1.0},
               "inter": {"latency_us": 900.0, "bandwidth_gbps": 1.0},
               "per_op": {"broadcast": {"latency_us": 100.0, "bandwidth_gbps": 4.0}}}
    local = load_preset(LOCAL, machine=machine)
    assert local.measured and local.shared_memory and local.devices == 2
    assert local.per_op["broadcast"].bandwidth_gbps == 4.0


@pytest.mark.parametrize("before", [None, "median", "mean", "mean by size"])
def test_a_cached_link_of_another_statistic_is_measured_again_and_one_by_size_is_read(tmp_path, monkeypatch, before):
    """The cached link says what it was fitted to; one from before (the median of each size's calls, their mean
    with no sizes kept, or by size without what a call adds after compute) is measured again, once, and the one
    measured then is read as it is."""
    from harness.prediction import hardware
    from harness.prediction.links import Link

    monkeypatch.setenv("HARNESS_MACHINE_CACHE", str(tmp_path))
    monkeypatch.setattr(hardware, "cpu_speed", lambda: 0.1)  # the CPU as fast as when the link was measured
    rates = {"cpu:1": {"float32": 0.1, "bfloat16": 0.2, "float16": 0.01}}
    hardware.write_machine({"rates": rates, "memory_gbps": {"cpu:1": 9.0},
                            "link": {"latency_us": 100.0, "bandwidth_gbps": 2.0}, "per_op": {},
                            **({"link_statistic": before} if before else {})})
    calls = []

    def measure() -> tuple[Link, dict[str, Link]]:
        calls.append(1)
        return Link(400.0, 1.5), {"all_reduce": Link(390.0, 1.7)}

    first = hardware.measure_machine(1, "cpu", 2, measure, 24.0)
    again = hardware.measure_machine(1, "cpu", 2, measure, 24.0)
    assert len(calls) == 1
    assert first["intra"] == again["intra"] == {"latency_us": 400.0, "bandwidth_gbps": 1.5}
    assert hardware.read_machine()["link_statistic"] == "mean by size, after compute"


@pytest.mark.parametrize("recorded", ["with the link", "a cache from before: the speed cached beside it"])
def test_a_link_measured_when_the_cpu_ran_faster_is_taken_at_its_speed_now(tmp_path, monkeypatch, recorded):
    """gloo's calls are the CPU's work: a link measured when one thread's matrix products ran at 0.2 TFLOP/s, read
    when they run at 0.16, is 0.8x as fast: 400 us / 0.8 = 500 us of latency, 1.5 GB/s x 0.8 = 1.2, each collective's
    own fit alike (390 us -> 487.5, 1.7 GB/s -> 1.36). A link measured in the same call is taken as measured."""
    from harness.prediction import hardware, targets
    from harness.prediction.links import Link

    monkeypatch.setenv("HARNESS_MACHINE_CACHE", str(tmp_path))
    speed = [0.16]
    monkeypatch.setattr(hardware, "cpu_speed", lambda: speed[0])
    rates = {"cpu:1": {"float32": 0.2, "bfloat16": 0.4, "float16": 0.02}}
    then = {"link_cpu_tflops": 0.2} if recorded == "with the link" else {}
    hardware.write_machine({"rates": rates, "memory_gbps": {"cpu:1": 9.0},
                            "link_statistic": "mean by size, after compute",
                            "link": {"latency_us": 400.0, "bandwidth_gbps": 1.5},
                            "per_op": {"all_reduce": {"latency_us": 390.0, "bandwidth_gbps": 1.7,
                                                      "sizes": [[4096, 0.0004], [65536, 0.0008]], "ranks": 2,
                                                      "after_compute": [[0.002, 0.0005]]}},
                            **then})
    machine = hardware.measure_machine(1, "cpu", 2, None, 24.0)
    assert machine["link_scale"] == pytest.approx(0.8)
    assert machine["intra"] == machine["inter"] == {"latency_us": pytest.approx(500.0),
                                                    "bandwidth_gbps": pytest.approx(1.2)}
    assert machine["per_op"]["all_reduce"] == {"latency_us": pytest.approx(487.5), "bandwidth_gbps": pytest.approx(1.36),
                                               "sizes": [[4096, pytest.approx(0.0005)], [65536, pytest.approx(0.001)]],
                                               "ranks": 2, "after_compute": [[0.002, pytest.approx(0.000625)]]}
    # each size's mean call, and what a call adds after compute, as long as the latency
    assert hardware.read_machine()["link"] == {"latency_us": 400.0, "bandwidth_gbps": 1.5}  # the cache as measured
    target = targets.local_target("cpu", 2, 1)
    assert target.link_scale == pytest.approx(0.8) and "0.80x its speed when the link was measured" in \
        target.link_notes(2)[0]

    hardware.write_machine({"rates": rates, "memory_gbps": {"cpu:1": 9.0}})  # no link: measured now, at 0.16
    machine = hardware.measure_machine(1, "cpu", 2, lambda: (Link(400.0, 1.5), {}), 24.0)
    assert machine["link_scale"] == 1.0 and machine["intra"] == {"latency_us": 400.0, "bandwidth_gbps": 1.5}
    assert hardware.read_machine()["link_cpu_tflops"] == 0.16
    speed[0] = 0.32  # twice as fast later: half the latency, twice the bandwidth
    assert hardware.measure_machine(1, "cpu", 2, None, 24.0)["intra"] == {"latency_us": pytest.approx(200.0),
                                                                           "bandwidth_gbps": pytest.approx(3.0)}


def test_the_planners_link_is_fitted_to_each_sizes_mean_call(monkeypatch):
    """Calls of 1 ms at the median and 3 ms on average at every size: the fitted link's times are the means."""
    import harness.collectives as collectives
    from harness import planning
    from harness.prediction.links import collective_seconds

    launches = []

    def benchmark(cfg, folder):
        launches.append(cfg["collectives"])
        rows = [{"op": op, "size_bytes": size, "time_us": 1000.0, "time_us_mean": 3000.0 + size / 1e3}
                for op in cfg["collectives"]["ops"] for size in (65536, 262144, 1048576, 4194304, 16777216)]
        # a size timed after a barrier only (no after_compute: not read), and 64 KiB also after compute: after a
        # barrier 1 and 3 ms, 2 on average
        raw = [{"op": op, "seconds": [0.009, 0.009]} for op in cfg["collectives"]["ops"]]
        if cfg["collectives"].get("after_compute_ms"):
            raw += [{"op": op, "seconds": [0.001, 0.003], "after_compute": {
                "1": [0.0015, 0.0015], "2": [0.0035, 0.0035], "4": [0.0030, 0.0030], "8": [0.0045, 0.0045]}}
                for op in cfg["collectives"]["ops"]]
        if cfg["collectives"]["dtype"] == "float32":  # noise put 256 KiB's mean below 64 KiB's
            rows[1]["time_us_mean"] = 2065.536
        return {"status": "ok", "rows": rows, "raw": raw, "world_size": 2}

    monkeypatch.setattr(collectives, "run_benchmark", benchmark)
    _, each = planning.measure_link(2, 20)
    # two launches, not three: float32's also times each op after compute, at one size
    assert [(c["dtype"], c.get("after_compute_ms"), c.get("after_compute_at")) for c in launches] == [
        ("float32", [1, 2, 4, 8], "64KiB"), ("bfloat16", None, None)]
    link = each["all_reduce:bfloat16"]  # 2 hops of 1.5 ms and 1 GB/s, from the means (medians: 2 x 0.5 ms, no bytes)
    assert (link.latency_us, link.bandwidth_gbps) == (pytest.approx(1500.0), pytest.approx(1.0))
    assert collective_seconds("all_reduce", 1048576, 2, 1, link, link) == pytest.approx((3000 + 1048576 / 1e3) * 1e-6)
    # each size's mean kept beside the line, on the ranks it was measured over, ascending
    assert link.ranks == 2 and link.sizes[0] == (65536, pytest.approx((3000 + 65.536) * 1e-6)) and len(link.sizes) == 5
    assert [size for size, _ in link.sizes] == sorted(size for size, _ in link.sizes)
    # a larger size measured shorter than a smaller one: the two pooled to their mean, (3065.536 + 2065.536) / 2 us
    first = each["all_reduce"].sizes
    assert first[0][1] == first[1][1] == pytest.approx(2565.536e-6) and first[2][1] == pytest.approx(4048.576e-6)
    # what a call adds after compute, each gap's mean over the ranks less the barrier's 2 ms: -0.5 (none), 1.5, 1.0
    # (pooled with 2 ms's: 1.25 each, no less after longer compute) and 2.5 ms; the op's, in bfloat16 too
    assert [gap for gap, _ in each["broadcast"].after_compute] == pytest.approx([0.001, 0.002, 0.004, 0.008])
    assert [added for _, added in each["broadcast"].after_compute] == pytest.approx([0.0, 0.00125, 0.00125, 0.0025])
    assert link.after_compute == each["all_reduce"].after_compute


def test_unknown_preset_names_the_closest_one():
    with pytest.raises(ConfigError) as caught:
        load_preset("h100x9")
    message = str(caught.value)
    assert message.startswith("plan.hardware=h100x9 is not allowed: did you mean h100x8?")
    assert "h100x16-ib" in message  # and lists them all


@pytest.mark.parametrize("change, field", [
    ("device_memory_gib: 24", "no `device_memory_gib`"),
    ("device_memory_gib: 24\n", "device_memory_gib: 0\n"),
    ("device_memory_gib: 24\n", "device_memory_gib: lots\n"),
    ("intra: {latency_us: 3, bandwidth_gbps: 20}", "intra: {latency_us: 3}"),
    ("peak_tflops: {float32: 10, bfloat16: 100, float16: 100}", "peak_tflops: {float32: 10}"),
    ("accelerator: cuda", "accelerator: tpu"),
    ("memory_gbps: 900", "no `memory_gbps`"),
    ("memory_gbps: 900", "memory_gbps: 0"),
    ("peak_tflops: {float32: 10, bfloat16: 100, float16: 100}", "peak_tflops: {float32: 10, bfloat16: 100, float16: 100, fp8: 1}"),
])
def test_a_bad_preset_is_refused_naming_the_field(tmp_path, change, field):
    text = GOOD.replace(change, "" if field.startswith("no ") else field)
    folder = write(tmp_path / "presets", "mine", text)
    with pytest.raises(ConfigError) as caught:
        load_preset("mine", preset_dir=folder)
    message = str(caught.value)
    assert message.startswith("plan.hardware=mine is not allowed:") and "\n" not in message
    named = field.removeprefix("no ").strip("`").split(":")[0].strip("` ")
    assert named in message, message


def test_a_good_user_preset_loads(tmp_path):
    preset = load_preset("mine", preset_dir=write(tmp_path / "presets", "mine", GOOD))
    assert preset.device_memory_gib == 24.0 and preset.inter.latency_us == 10.0


def test_the_preset_folder_is_in_conf():
    assert PRESET_DIR.parts[-3:] == ("conf", "plan", "hardware")


def test_the_machine_key_names_gpus_through_nvml_without_opening_a_cuda_context(monkeypatch):
    """torch.cuda.get_device_name initialises CUDA: in the parent it would hold a context's device memory
    (about 500 MiB) through every run it launches."""
    import sys

    import torch
    from test_memory import FakeNvml

    from harness.prediction import hardware

    def refuse(*args: object) -> str:
        raise AssertionError("torch.cuda.get_device_name opens a CUDA context in the parent")

    nvml = FakeNvml(used={0: 0, 1: 0}, procs={})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", refuse)
    assert hardware.gpu_names() == ["NVIDIA H100", "NVIDIA A100"]
    two = hardware.machine_key()
    assert nvml.initialised == nvml.shut_down == 2
    nvml.used = {0: 0}
    assert hardware.machine_key() != two  # another set of GPUs: measured again


def test_this_gpus_memory_is_nvmls_total_and_never_read_through_cuda_in_the_parent(monkeypatch):
    """NVML's c_nvmlMemory_t `total` (bytes); where NVML fails, a child process asks torch, never the parent."""
    import subprocess
    import sys

    import torch
    from test_memory import FakeNvml, NVMLError

    from harness.prediction import targets

    def refuse(*args: object) -> object:
        raise AssertionError("torch.cuda.get_device_properties initialises CUDA in the parent")

    nvml = FakeNvml(used={0: 3 * 2**30}, procs={})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "get_device_properties", refuse)
    assert targets.local_memory_gib("cuda") == 80.0  # total, not used (3) nor free (77)
    assert nvml.initialised == nvml.shut_down == 1

    def no_driver() -> None:
        raise NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED

    asked: list[list[str]] = []

    def child(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=f"{141 * 2**30}\n", stderr="")

    monkeypatch.setattr(nvml, "nvmlInit", no_driver)
    monkeypatch.setattr(subprocess, "run", child)
    assert targets.local_memory_gib("cuda") == 141.0
    assert asked and asked[0][0] == sys.executable and "total_memory" in asked[0][-1]


def test_a_users_own_gpu_file_plans_like_a_shipped_preset(tmp_path, monkeypatch):
    """plan.hardware=my_gpu.yaml (relative to where run.py was started): the same checks and the same prediction
    as the shipped preset it copies; a file that is not there is one line naming it."""
    from conftest import run_config

    from harness.launch.on_preset import predict_on
    from harness.prediction.hardware import PRESET_DIR

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_gpu.yaml").write_text((PRESET_DIR / "l40sx8.yaml").read_text())
    cfg = run_config("ddp", nprocs=8, batch_size=64)
    own, shipped = predict_on(cfg, "my_gpu.yaml", 2), predict_on(cfg, "l40sx8", 2)
    assert own["status"] == shipped["status"] == "predicted"
    assert own["prediction"]["s_per_iteration"] == shipped["prediction"]["s_per_iteration"]
    assert load_preset("my_gpu.yaml").device_memory_gib == 44.99
    from harness.core.config import check_plan

    assert check_plan({"enabled": True, "hardware": "gpus/my_gpu.yaml"}).hardware == "gpus/my_gpu.yaml"
    with pytest.raises(ConfigError, match="or a preset file of your own"):
        check_plan({"enabled": True, "hardware": "h100 x8"})
    with pytest.raises(ConfigError) as missing:
        load_preset("their_gpu.yaml")
    assert str(missing.value).startswith("plan.hardware=their_gpu.yaml is not allowed: a preset file that exists")
    (tmp_path / "bad.yaml").write_text(GOOD.replace("device_memory_gib: 24", "device_memory_gib: 0"))
    with pytest.raises(ConfigError) as bad:
        load_preset("bad.yaml")
    assert "`device_memory_gib` is a number of GiB > 0" in str(bad.value)


@pytest.mark.parametrize("name", ["l40sx8", "l4x8", "a10x4", "rtx4090x8", "rtx3090x8", "a6000x8", "rtx6000adax8"])
def test_the_rented_gpus_presets_load_with_their_datasheets_dense_rates(name):
    """Dense rates (a sparse figure would double them), half types above float32, GDDR bandwidths."""
    preset = load_preset(name)
    assert preset.accelerator == "cuda" and preset.devices_per_node in (4, 8)
    rates = preset.peak_tflops
    assert rates["bfloat16"] == rates["float16"] == pytest.approx(2 * rates["tf32"], rel=0.02) or name == "rtx4090x8"
    assert rates["float32"] < rates["bfloat16"] < 400 and 250 <= preset.memory_gbps <= 1008
