"""Hardware presets (conf/plan/hardware/*.yaml), checked field by field, and this machine's measured one.

A preset is what a prediction needs of a machine it may never have run on: device memory, peak compute per
dtype, and the two links (inside a node, between nodes) as latency and bus bandwidth. `local` is this
machine, measured on first use and cached (its compute by timing matrix products, its link by the harness's
collectives benchmark, fitted by harness.prediction.links); the cache's key names the hardware and torch version,
so a different machine or torch measures anew."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from harness.core.config import CONF_DIR, PRESET_FILE_SUFFIXES
from harness.core.errors import ConfigError
from harness.prediction.links import Link

PRESET_DIR = CONF_DIR / "plan" / "hardware"
LOCAL = "local"
DTYPES = ("float32", "bfloat16", "float16")
OPTIONAL_DTYPES = ("tf32",)  # GPUs with TF32 tensor cores: float32 convolutions (and matmuls where allowed) run there
FIELDS = ("accelerator", "devices_per_node", "nodes", "device_memory_gib", "memory_gbps", "peak_tflops", "intra",
          "inter")
OPTIONAL_FIELDS = ("kernel_share",)
# what a published benchmark of the device's best kernel reached of its datasheet peak, by the GPU model's operator
# class (harness.prediction.gpu_model): the fitted factors multiply this, not the datasheet
KERNEL_SHARE_CLASSES = ("matmul", "attention")
GIB = 2**30


@dataclass(frozen=True)
class Preset:
    name: str
    accelerator: str  # cuda | cpu
    devices_per_node: int
    nodes: int
    device_memory_gib: float  # per device; on CPU the RAM, which every rank shares
    peak_tflops: Mapping[str, float]  # per device and dtype (tf32 where it has it); on CPU per process
    memory_gbps: float  # the device memory's bandwidth, GB/s (HBM on a GPU; on CPU measured by a copy)
    intra: Link
    inter: Link
    measured: bool = False
    source: str = ""
    per_op: Mapping[str, Link] = field(default_factory=dict)  # this machine: each collective's own fitted link
    kernel_share: Mapping[str, float] = field(default_factory=dict)  # KERNEL_SHARE_CLASSES; absent: 1 (the datasheet)

    @property
    def devices(self) -> int:
        return self.devices_per_node * self.nodes

    @property
    def shared_memory(self) -> bool:
        """CPU ranks share the host's RAM: they fit together or not at all."""
        return self.accelerator == "cpu"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def preset_names(preset_dir: Path = PRESET_DIR) -> list[str]:
    return sorted(p.stem for p in preset_dir.glob("*.yaml"))


def user_file(name: str) -> Path | None:
    """`plan.hardware=path/to/my_gpu.yaml`: a user's own preset, outside the package (None: a shipped name)."""
    return Path(name).expanduser() if name.endswith(PRESET_FILE_SUFFIXES) else None


def preset_accelerator(name: str, preset_dir: Path = PRESET_DIR) -> str | None:
    """The preset's accelerator as its file says (None: no such preset, or unreadable: checked later, in full)."""
    try:
        data = yaml.safe_load((user_file(name) or preset_dir / f"{name}.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data.get("accelerator") if isinstance(data, Mapping) else None


def load_preset(name: str, preset_dir: Path = PRESET_DIR, machine: Mapping[str, Any] | None = None,
                nodes: int = 0) -> Preset:
    """The preset `name`, every field checked (ConfigError naming plan.hardware, the file and the field).
    `local` needs this machine's measurements (`machine`, from `measure_machine`). A name ending in .yaml is a
    user's own file, checked like a shipped one (docs/plan.md says what goes in each field). `nodes` (plan.nodes):
    that many of its nodes instead of its own count (0: its own), joined by its `inter` link."""
    preset = _load_preset(name, preset_dir, machine)
    if not nodes or nodes == preset.nodes:
        return preset
    return dataclasses.replace(preset, nodes=nodes, name=f"{preset.name}*{nodes}")


def _load_preset(name: str, preset_dir: Path, machine: Mapping[str, Any] | None) -> Preset:
    names = preset_names(preset_dir)
    own = user_file(name)
    if own is not None and not own.is_file():
        raise ConfigError("plan.hardware", name, "a preset file that exists (relative to where run.py was started), "
                          "or a preset of conf/plan/hardware/: " + ", ".join(names))
    if own is None and name not in names:
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.4)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError("plan.hardware", name, f"{hint}a preset of conf/plan/hardware/: " + ", ".join(names) +
                          " (or add <name>.yaml there)")
    path = own or preset_dir / f"{name}.yaml"
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError("plan.hardware", name, f"a readable yaml file ({path}: {str(error).splitlines()[0]})") \
            from None
    if not isinstance(data, Mapping):
        raise ConfigError("plan.hardware", name, f"a mapping of {', '.join(FIELDS)} in {path}")
    per_op = {}
    if machine is not None and any(data.get(k) == "measured" for k in FIELDS):
        per_op = {op: Link(**link) for op, link in (machine.get("per_op") or {}).items()}
        machine = {k: v for k, v in machine.items() if k in FIELDS}
        data = {k: machine[k] if data.get(k) == "measured" else data.get(k) for k in FIELDS}
    preset = check_preset(name, data, str(path), measured=name == LOCAL)
    return dataclasses.replace(preset, per_op=per_op) if per_op else preset


def check_preset(name: str, data: Mapping[str, Any], source: str, measured: bool = False) -> Preset:
    def bad(field: str, value: object, allowed: str) -> ConfigError:
        return ConfigError("plan.hardware", name, f"a preset whose `{field}` is {allowed} ({source} has "
                           f"{field}: {value!r})")

    missing = [k for k in FIELDS if k not in data]
    if missing:
        raise ConfigError("plan.hardware", name, f"a preset with every field ({', '.join(FIELDS)}): "
                                   f"{source} has no `{missing[0]}`")
    unknown = sorted(set(data) - set(FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        raise bad(unknown[0], data[unknown[0]], "not a preset field: the fields are " + ", ".join(FIELDS) +
                  " and optionally " + ", ".join(OPTIONAL_FIELDS))
    if data["accelerator"] not in ("cuda", "cpu"):
        raise bad("accelerator", data["accelerator"], "cuda or cpu")
    for key in ("devices_per_node", "nodes"):
        if isinstance(data[key], bool) or not isinstance(data[key], int) or data[key] < 1:
            raise bad(key, data[key], "an integer >= 1")
    memory = data["device_memory_gib"]
    if isinstance(memory, bool) or not isinstance(memory, int | float) or not memory > 0:
        raise bad("device_memory_gib", memory, "a number of GiB > 0")
    bandwidth = data["memory_gbps"]
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, int | float) or not bandwidth > 0:
        raise bad("memory_gbps", bandwidth, "the device memory's bandwidth in GB/s, > 0")
    rates = data["peak_tflops"]
    if not isinstance(rates, Mapping) or not set(DTYPES) <= set(rates) <= {*DTYPES, *OPTIONAL_DTYPES}:
        raise bad("peak_tflops", rates, "a mapping of " + ", ".join(DTYPES) + " (and tf32 where the device has "
                  "it) to TFLOP/s")
    for dtype, rate in rates.items():
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise bad(f"peak_tflops.{dtype}", rate, "a number of TFLOP/s > 0")
    links = {}
    for key in ("intra", "inter"):
        link = data[key]
        if not isinstance(link, Mapping) or set(link) != {"latency_us", "bandwidth_gbps"}:
            raise bad(key, link, "a mapping of latency_us and bandwidth_gbps")
        for part, least in (("latency_us", 0.0), ("bandwidth_gbps", None)):
            value = link[part]
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or \
                    (least is None and not value > 0):
                raise bad(f"{key}.{part}", value, "a number >= 0" if least is not None else "a number > 0")
        links[key] = Link(float(link["latency_us"]), float(link["bandwidth_gbps"]))
    shares = data.get("kernel_share") or {}
    if not isinstance(shares, Mapping) or not set(shares) <= set(KERNEL_SHARE_CLASSES):
        raise bad("kernel_share", shares, "a mapping of " + " and ".join(KERNEL_SHARE_CLASSES) + " to the share of "
                  "the peak a published kernel benchmark reached")
    for kind, share in shares.items():
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise bad(f"kernel_share.{kind}", share, "a share of the peak, > 0 and <= 1")
    return Preset(name=name, accelerator=data["accelerator"], devices_per_node=data["devices_per_node"],
                  nodes=data["nodes"], device_memory_gib=float(memory), memory_gbps=float(bandwidth),
                  peak_tflops={k: float(v) for k, v in rates.items()}, intra=links["intra"], inter=links["inter"],
                  measured=measured, source=source, kernel_share={k: float(v) for k, v in shares.items()})


# ---- this machine ----

def machine_key() -> str:
    """What the measurements depend on: the processor, the cores, the GPUs, torch."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = gpu_names() if torch.cuda.is_available() else []
    text = json.dumps([cpu, len(os.sched_getaffinity(0)), gpus, torch.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def gpu_names() -> list[str]:
    """Every GPU's name through NVML: torch.cuda.get_device_name would open a CUDA context in the parent, which
    then holds device memory through the whole run. Without NVML, torch's count alone."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 (no NVML library or driver: any of pynvml's errors)
        return [f"{torch.cuda.device_count()} GPUs"]
    try:
        names = (pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(pynvml.nvmlDeviceGetCount()))
        return [name.decode() if isinstance(name, bytes) else name for name in names]
    finally:
        pynvml.nvmlShutdown()


# what the cached link is fitted to, per size (harness.planning.measure_link); a cache of another is measured
# again: "mean" alone had no sizes kept beside its fit, nor 4, 16 and 512 KiB among them; "mean by size" not what a
# call adds after compute
LINK_STATISTIC = "mean by size, after compute"


def cache_path() -> Path:
    base = os.environ.get("HARNESS_MACHINE_CACHE") or \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "parallel-harness"
    return Path(base) / f"machine-{machine_key()}.json"


def read_machine() -> dict[str, Any]:
    path = cache_path()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_machine(data: Mapping[str, Any]) -> None:
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=1))
    temporary.replace(path)


def gemm_tflops(dtype: torch.dtype, threads: int, device: str = "cpu", size: int = 512) -> float:
    """Achieved TFLOP/s of square matrix products in `dtype` on `threads` threads (the best of a few)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        best = float("inf")
        for _ in range(4):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(3):
                a @ b
            if device == "cuda":
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - start) / 3)
        return 2 * size**3 / best / 1e12
    finally:
        torch.set_num_threads(previous)


def copy_gbps(threads: int, mib: int = 256) -> float:
    """This CPU's memory bandwidth as a large copy reaches it (bytes read and written, the best of a few)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        source = torch.ones(mib * 2**18)
        target = torch.empty_like(source)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            target.copy_(source)
            best = min(best, time.perf_counter() - start)
        return 2 * source.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(previous)


def gemm_rates(threads: int, accelerator: str) -> dict[str, float]:
    """TFLOP/s per dtype; on a GPU in a spawned child (the parent creates no CUDA context)."""
    if accelerator != "cuda":
        return {name: gemm_tflops(getattr(torch, name), threads) for name in DTYPES}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return {name: pool.submit(gemm_tflops, getattr(torch, name), threads, "cuda", 4096).result()
                for name in DTYPES}


def measure_machine(threads: int, accelerator: str, devices: int,
                    measure_link: Callable[[], tuple[Link, dict[str, Link]]] | None,
                    memory_gib: float) -> dict[str, Any]:
    """This machine as a preset's fields, measured where the cache lacks them (compute per thread count; the
    link once, by `measure_link`, when there are several devices to link)."""
    cached = read_machine()
    rates = dict(cached.get("rates", {}))  # a copy: the cache is rewritten only when it changed
    key = f"{accelerator}:{threads}"
    if key not in rates:
        rates[key] = gemm_rates(threads, accelerator)
    bandwidths = dict(cached.get("memory_gbps", {}))
    if key not in bandwidths:  # a GPU's own is its datasheet's business: the planner times CPUs only
        bandwidths[key] = copy_gbps(threads)
    link, per_op, statistic = cached.get("link"), cached.get("per_op"), cached.get("link_statistic")
    recorded = cached.get("link_cpu_tflops")  # a CPU's speed when its link was measured
    # a link fitted to another statistic of the calls (the median, before) is measured again where it can be
    measured = (link is None or statistic != LINK_STATISTIC) and measure_link is not None and devices > 1
    if measured:
        pooled, each = measure_link()
        link, per_op = asdict(pooled), {op: asdict(fit) for op, fit in each.items()}
        statistic = LINK_STATISTIC
    now = cpu_speed() if link and accelerator == "cpu" else None
    if measured:
        recorded = now  # None on a GPU machine: its link is read as measured
    # a cache from before the speed was recorded: the speed cached beside the link
    link_speed = recorded or (rates.get("cpu:1", {}).get("float32") if accelerator == "cpu" else None)
    data = {**cached, "rates": rates, "memory_gbps": bandwidths, "link": link, "per_op": per_op,
            "link_statistic": statistic, **({"link_cpu_tflops": recorded} if recorded else {})}
    if data != cached:
        write_machine(data)
    scale = now / link_speed if now and link_speed else 1.0
    return {"accelerator": accelerator, "devices_per_node": devices, "nodes": 1, "device_memory_gib": memory_gib,
            "memory_gbps": bandwidths[key], "peak_tflops": rates[key], "link_measured": link is not None,
            "per_op": {op: at_speed(fit, scale) for op, fit in (per_op or {}).items()}, "link_scale": scale,
            "intra": at_speed(link, scale) if link else {"latency_us": 0.0, "bandwidth_gbps": 1e9},  # one device:
            "inter": at_speed(link, scale) if link else {"latency_us": 0.0, "bandwidth_gbps": 1e9}}  # never used


def cpu_speed() -> float:
    """How fast this CPU runs now: one thread's float32 matrix products, TFLOP/s (a few ms)."""
    return gemm_tflops(torch.float32, 1)


def at_speed(link: Mapping[str, Any], scale: float) -> dict[str, Any]:
    """A CPU link (gloo: copies, reductions and loopback sockets, all work of the CPU) measured when the CPU ran
    at one speed, at `scale` times that speed: its latency divided and its bandwidth multiplied by it. A VM's
    host varies by tens of percent between hours (2026-12-07, an Intel VM: one thread's matrix products at 0.80x
    their speed of two hours before, gloo's all-reduce of 128 KiB and 2 MiB 1.41x and 1.31x as long), and the
    compute is calibrated anew for each prediction while the link is measured once."""
    scaled = {"latency_us": link["latency_us"] / scale, "bandwidth_gbps": link["bandwidth_gbps"] * scale}
    if link.get("sizes"):  # each measured size's mean call, as long as the latency is
        scaled.update(sizes=[[size, seconds / scale] for size, seconds in link["sizes"]], ranks=link["ranks"])
    if link.get("after_compute"):  # what a call adds after compute, as the latency
        scaled.update(after_compute=[[gap, seconds / scale] for gap, seconds in link["after_compute"]])
    return scaled
