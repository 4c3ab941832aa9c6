"""A training step's time on a GPU this machine does not have, from the step's own operators.

The step (forward, backward, the optimizer's step) is traced once on tensors with no data (harness.plan.trace's
meta or fake tensors), every aten operator recorded with its FLOPs (torch.utils.flop_counter's formulas) and the
bytes it reads and writes. On a preset each operator then costs its roofline time, the longer of

- its FLOPs at the peak of the dtype it computes in (tensor cores for half types; TF32 for float32 convolutions,
  torch's default, and for float32 matrix products only where TF32 is allowed) times the fraction of that peak
  its class reaches (convolutions, matrix products and attention apart), and
- its bytes at the device's memory bandwidth times the fraction of it that bandwidth-bound kernels reach,

plus a fixed cost per kernel launched; the CPU dispatching the kernels runs ahead, so a phase takes at least its
kernels x the CPU's cost per kernel (what bounds small batches). Ranks that wait for each other every iteration wait for the slowest:
a step of n ranks takes E[max of n] of their times, with a fitted rank-to-rank variation. The fractions, the
launch cost and the variation are few, and fitted to published training results (harness.plan.published,
`python bench/projection.py --fit`); they ship in harness/plan/gpu_factors.yaml with the fit's leave-one-out
error, which is the band every GPU prediction carries. A speedup across GPUs or amp levels comes out of this
model (the dtypes of the operators, the preset's peaks and bandwidth), never out of a ratio of datasheets.

torch's RuntimeEstimator (torch.distributed._tools) has a roofline mode too, but it reads the peak rates and
bandwidth of the GPU it runs on; the planner runs where there is none."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

FACTORS_FILE = Path(__file__).with_name("gpu_factors.yaml")
CONV_OPS = frozenset({"convolution", "convolution_backward", "_convolution", "cudnn_convolution"})
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"})
ATTENTION_PREFIX = "_scaled_dot_product"
NO_KERNEL_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
                           "_record_function_enter_new", "_record_function_exit", "lift_fresh",
                           "_local_scalar_dense", "set_", "resize_"})
FOREACH_TENSORS_PER_LAUNCH = 64  # CUDA's multi_tensor_apply takes 36-110 tensors per launch by depth: a middle figure
KINDS = ("conv", "matmul", "attention", "memory")
BAND_Z = 1.645  # a band holding 90 % of lognormal errors
PHASES = ("forward_backward", "optimizer")


@dataclass(frozen=True)
class OpCost:
    """One operator as traced: what it computes and moves; its time is the preset's business."""

    kind: str  # conv | matmul | attention | memory
    dtype: str  # the dtype it computes in: float32 | bfloat16 | float16
    phase: str  # forward_backward | optimizer
    flops: float
    bytes: float
    kernels: int


@dataclass(frozen=True)
class StepOps:
    """A traced step's operators, in order; `samples` is what one step processes (images or sequences)."""

    ops: tuple[OpCost, ...]
    samples: int

    def totals(self) -> dict[str, dict[str, float]]:
        """FLOPs, bytes and kernels by kind (what the page and plan.json show)."""
        out: dict[str, dict[str, float]] = {}
        for op in self.ops:
            row = out.setdefault(op.kind, {"flops": 0.0, "bytes": 0.0, "kernels": 0})
            row["flops"] += op.flops
            row["bytes"] += op.bytes
            row["kernels"] += op.kernels
        return out

    @property
    def flops(self) -> float:
        return sum(op.flops for op in self.ops if op.phase == "forward_backward")

    def arrays(self, tf32_matmul: bool) -> _Arrays:
        """The ops as numpy columns: a fit evaluates thousands of factor sets on one trace."""
        return _arrays(self, tf32_matmul)


@functools.lru_cache(maxsize=256)
def _arrays(step: StepOps, tf32_matmul: bool) -> _Arrays:
    import numpy as np

    keys = [peak_key(op, tf32_matmul) for op in step.ops]
    peak_keys = tuple(sorted(set(keys)))
    return _Arrays(np.array([KINDS.index(op.kind) for op in step.ops], dtype=int),
                   np.array([peak_keys.index(k) for k in keys], dtype=int), peak_keys,
                   np.array([op.flops for op in step.ops]), np.array([op.bytes for op in step.ops]),
                   np.array([op.kernels for op in step.ops]),
                   np.array([op.phase == "optimizer" for op in step.ops], dtype=int))


@dataclass(frozen=True)
class GpuFactors:
    """What a GPU reaches of its datasheet, fitted to published training results."""

    conv: float  # achieved / peak for convolutions (forward and both backward kernels)
    matmul: float  # achieved / peak for matrix products and attention
    memory: float  # achieved / memory bandwidth for every other kernel (normalisations, pointwise, optimizer)
    launch_us: float  # per kernel, on the GPU: launch and the gap between kernels
    sync_cv: float  # rank-to-rank variation of a step's time, for ranks that wait for each other
    nchw: float = 0.0  # a tensor-core convolution on NCHW tensors moves this many times its bytes more (layout changes)
    # the CPU's side of eager execution, per kernel: it runs ahead of the GPU, so a step takes the longer of the two.
    # Assumed, not fitted (every published case is GPU-bound, so none can tell it); the GPU check measures it
    dispatch_us: float = 10.0
    log_sd: float = 0.0  # leave-one-out SD of log(predicted / published): the band's width
    cases: int = 0  # published results it was fitted to
    source: str = ""

    def band(self, z: float = BAND_Z) -> tuple[float, float]:
        """Multipliers of a predicted time holding 90 % of the leave-one-out errors (if they are lognormal)."""
        return math.exp(-z * self.log_sd), math.exp(z * self.log_sd)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@functools.lru_cache(maxsize=4)
def load_factors(path: Path = FACTORS_FILE) -> GpuFactors:
    data = yaml.safe_load(path.read_text())
    return GpuFactors(**{f.name: data[f.name] for f in dataclasses.fields(GpuFactors) if f.name in data})


def write_factors(factors: GpuFactors, path: Path = FACTORS_FILE, header: str = "") -> None:
    body = yaml.safe_dump({k: (round(v, 5) if isinstance(v, float) else v) for k, v in factors.as_dict().items()},
                          sort_keys=False)
    path.write_text(header + body)
    load_factors.cache_clear()


# ---- tracing ----

def _kind(name: str) -> str:
    if name in CONV_OPS:
        return "conv"
    if name in MATMUL_OPS:
        return "matmul"
    if name.startswith(ATTENTION_PREFIX):
        return "attention"
    return "memory"


def _tensor_bytes(values: Any) -> tuple[float, int]:
    """Bytes of every tensor in `values` (nested lists included), and how many tensors."""
    tensors = [t for t in tree_flatten(values)[0] if isinstance(t, torch.Tensor)]
    return float(sum(t.numel() * t.element_size() for t in tensors)), len(tensors)


class OperatorRecorder(TorchDispatchMode):
    """Records each aten operator the step dispatches (views and allocations launch nothing, and are left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[OpCost] = []
        self.phase = "forward_backward"
        self.recording = True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if not self.recording or func.is_view or name in NO_KERNEL_OPS or func.namespace != "aten":
            return out  # prim::device, the profiler's marks: no kernel
        read, _ = _tensor_bytes((args, kwargs))
        lists = max((len(a) for a in args if isinstance(a, list | tuple)), default=0)
        written, _ = _tensor_bytes(out)
        counter = flop_registry.get(func.overloadpacket)
        flops = float(counter(*args, **kwargs, out_val=out)) if counter else 0.0
        first = next((t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
        dtype = str(first.dtype).removeprefix("torch.") if first is not None else "float32"
        kernels = math.ceil(lists / FOREACH_TENSORS_PER_LAUNCH) if name.startswith("_foreach") and lists else 1
        self.ops.append(OpCost(_kind(name), dtype, self.phase, flops, read + written, kernels))
        return out

    @contextlib.contextmanager
    def phase_of(self, phase: str) -> Iterator[None]:
        previous, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = previous


def record_step(forward_backward: Callable[[], None], step: Callable[[], None], samples: int) -> StepOps:
    """The ops of one training step, after an untraced one (the optimizer's state exists from the first step,
    and its first step clones what later steps update in place). Call inside the tracer's tensor mode."""
    forward_backward()
    step()
    recorder = OperatorRecorder()
    with recorder:
        forward_backward()
        with recorder.phase_of("optimizer"):
            step()
    return StepOps(tuple(recorder.ops), samples)


# ---- timing on a preset ----

@dataclass(frozen=True)
class GpuTime:
    forward_backward_s: float
    optimizer_s: float
    by_kind: Mapping[str, float]  # seconds per kind, launches apart
    launches_s: float
    kernels: int

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "by_kind": dict(self.by_kind)}


def peak_key(op: OpCost, tf32_matmul: bool) -> str:
    """The peak an operator computes at: its dtype, or TF32 for a float32 convolution (cuDNN's default in torch)
    or a float32 matrix product where TF32 is allowed (torch.backends.cuda.matmul.allow_tf32)."""
    if op.dtype != "float32" or op.kind == "memory":
        return op.dtype
    return "tf32" if op.kind == "conv" or tf32_matmul else "float32"


def step_time(step: StepOps, peaks: Mapping[str, float], memory_gbps: float, factors: GpuFactors,
              tf32_matmul: bool = False, channels_last: bool = False) -> GpuTime:
    """One step of one device, each operator at its roofline time and a launch each. `peaks`: TFLOP/s per
    dtype (`tf32` absent: float32's). Tensor-core convolutions (half types, TF32) on NCHW tensors (torch's default
    layout) pay the layout changes those kernels make, a fitted multiple of their bytes; channels_last ones do
    not."""
    import numpy as np

    arrays = step.arrays(tf32_matmul)
    rates = np.array([peaks.get(key) or peaks["float32"] for key in arrays.peak_keys]) * 1e12
    efficiency = np.array([{"conv": factors.conv, "matmul": factors.matmul, "attention": factors.matmul,
                            "memory": 1.0}[kind] for kind in KINDS])
    compute = np.where(arrays.kind < 3, arrays.flops / (rates[arrays.peak] * efficiency[arrays.kind]), 0.0)
    bandwidth = memory_gbps * 1e9 * factors.memory
    seconds = np.maximum(compute, arrays.bytes / bandwidth)
    if not channels_last:
        tensor_cores = np.array([key in ("float16", "bfloat16") or (key == "tf32" and "tf32" in peaks)
                                 for key in arrays.peak_keys])[arrays.peak]
        seconds = seconds + (arrays.kind == 0) * tensor_cores * arrays.bytes * factors.nchw / bandwidth
    launches = arrays.kernels * factors.launch_us * 1e-6
    total = seconds + launches
    by_kind = {kind: float(seconds[arrays.kind == i].sum()) for i, kind in enumerate(KINDS)}
    phases = [max(float(total[arrays.optimizer == k].sum()),
                  float(arrays.kernels[arrays.optimizer == k].sum()) * factors.dispatch_us * 1e-6) for k in (0, 1)]
    return GpuTime(phases[0], phases[1], by_kind, float(launches.sum()), int(arrays.kernels.sum()))


@dataclass(frozen=True)
class _Arrays:
    kind: Any  # index into KINDS
    peak: Any  # index into peak_keys
    peak_keys: tuple[str, ...]
    flops: Any
    bytes: Any
    kernels: Any
    optimizer: Any  # 1 for the optimizer's step


@functools.lru_cache(maxsize=64)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for one)."""
    if n <= 1:
        return 0.0
    from scipy import integrate, stats

    def density(x: float) -> float:
        return x * n * stats.norm.pdf(x) * stats.norm.cdf(x) ** (n - 1)

    return float(integrate.quad(density, -10, 10)[0])


def straggle(n: int, factors: GpuFactors) -> float:
    """How much longer n ranks that wait for each other take than one: 1 + cv x E[max of n]."""
    return 1.0 + factors.sync_cv * expected_max_normal(n)
