"""A training step's time on a GPU this machine does not have, from the step's own operators.

The step (forward, backward, the optimizer's step) is traced once on tensors with no data (harness.prediction.trace's
meta or fake tensors), every aten operator recorded with its FLOPs (torch.utils.flop_counter's formulas) and the
bytes it reads and writes. On a preset each operator then costs its roofline time, the longer of

- its FLOPs at the peak of the dtype it computes in (tensor cores for half types; TF32 for float32 convolutions,
  torch's default, and for float32 matrix products only where TF32 is allowed) times the fraction of that peak
  its class reaches, and
- its bytes at the device's memory bandwidth times the fraction of it its class reaches,

the classes being those that run differently on a GPU (OPERATOR_CLASSES says what each factor means): dense,
grouped and depthwise convolution, matrix products, fused attention, normalisations, reductions and the other
(elementwise) kernels. In eager mode nothing fuses: each aten operator is its kernel. Each
kernel also pays a fixed launch cost; the CPU dispatching the kernels runs ahead, so a phase takes at least its
kernels x the CPU's cost per kernel (what bounds small batches). Ranks that wait for each other every iteration wait for the slowest:
a step of n ranks takes E[max of n] of their times, with a fitted rank-to-rank variation. The fractions, the
launch cost and the variation are few, and fitted to published training results (harness.prediction.published,
`python bench/projection.py --fit`); they ship in harness/prediction/gpu_factors.yaml with the fit's leave-one-out
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
from torch.utils.flop_counter import conv_flop_count, flop_registry, shape_wrapper

from harness.core import fusion

FACTORS_FILE = Path(__file__).with_name("gpu_factors.yaml")
CONV_OPS = frozenset({"convolution", "convolution_backward", "_convolution", "cudnn_convolution"})
WEIGHT_ARG = {"convolution_backward": 2}  # where a convolution op's weight is (1 for the others)
GROUPS_ARG = {"convolution": 8, "_convolution": 8, "convolution_backward": 9, "cudnn_convolution": 5}
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"})
ATTENTION_PREFIX = "_scaled_dot_product"
NORM_NAMES = ("batch_norm", "layer_norm", "group_norm", "rms_norm", "instance_norm")
REDUCTION_OPS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "norm",
                           "linalg_vector_norm", "_foreach_norm", "_softmax", "_log_softmax", "_softmax_backward_data",
                           "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward",
                           "nll_loss2d_forward", "nll_loss2d_backward", "_adaptive_avg_pool2d",
                           "_adaptive_avg_pool2d_backward", "cumsum", "topk", "sort"})
NO_KERNEL_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
                           "_record_function_enter_new", "_record_function_exit", "lift_fresh",
                           "_local_scalar_dense", "set_", "resize_"})
# where fused attention's is_causal is (forward, backward): its time is half the FLOPs torch counts
CAUSAL_ARG = {"_scaled_dot_product_flash_attention_for_cpu": 4, "_scaled_dot_product_flash_attention_for_cpu_backward": 7,
              "_scaled_dot_product_flash_attention": 4, "_scaled_dot_product_flash_attention_backward": 11}
FOREACH_TENSORS_PER_LAUNCH = 64  # CUDA's multi_tensor_apply takes 36-110 tensors per launch by depth: a middle figure


@dataclass(frozen=True)
class OperatorClass:
    """What an operator class reaches on a GPU: the factor of its peak FLOP rate (None: its FLOPs never bound it),
    the factor of the memory bandwidth, and whether its FLOPs run on tensor cores."""

    compute: str | None
    bandwidth: str
    tensor_cores: bool
    meaning: str


OPERATOR_CLASSES = {
    "conv": OperatorClass("conv", "memory", True, "dense convolutions (groups=1), forward and both backward kernels"),
    "conv_grouped": OperatorClass("grouped", "memory", True, "grouped convolutions (1 < groups < channels, "
                                  "ResNeXt's): narrow per-group GEMMs that fill tensor cores worse"),
    "conv_depthwise": OperatorClass(None, "depthwise", False, "depthwise convolutions (one channel a group: "
                                    "MobileNet's, EfficientNet's): CUDA-core kernels bound by their memory traffic"),
    "matmul": OperatorClass("matmul", "memory", True, "matrix products (mm, addmm, bmm: linear layers, unfused "
                            "attention)"),
    "attention": OperatorClass("attention", "memory", True, "fused attention (SDPA's flash or memory-efficient "
                               "backend, as the GPU run would take it)"),
    "norm": OperatorClass(None, "norm", False, "batch, layer, group and RMS normalisations, forward and backward: "
                          "two passes over their input (statistics, then the output)"),
    "reduction": OperatorClass(None, "memory", False, "reductions (sums, means, softmax, the loss)"),
    "elementwise": OperatorClass(None, "memory", False, "every other kernel (activations, additions, copies, "
                                 "pooling, the optimizer's updates): bandwidth-bound"),
}
KINDS = tuple(OPERATOR_CLASSES)
BAND_Z = 1.645  # a band holding 90 % of lognormal errors
PHASES = ("forward_backward", "optimizer")


@dataclass(frozen=True)
class OpCost:
    """One operator as traced: what it computes and moves; its time is the preset's business."""

    kind: str  # a key of OPERATOR_CLASSES
    dtype: str  # the dtype it computes in: float32 | bfloat16 | float16
    phase: str  # forward_backward | optimizer
    flops: float
    bytes: float
    kernels: float  # launches (a multi-tensor kernel's: its mean over list lengths)


@dataclass(frozen=True)
class StepOps:
    """A traced step's operators, in order; `samples` is what one step processes (images or sequences).
    `weights`: how many times each operator counts (None: once each), for a step assembled from traces of fewer
    repeated blocks (`repeated`)."""

    ops: tuple[OpCost, ...]
    samples: int
    weights: tuple[float, ...] | None = None

    def weighted(self) -> list[tuple[OpCost, float]]:
        return list(zip(self.ops, self.weights or (1.0,) * len(self.ops), strict=True))

    def totals(self) -> dict[str, dict[str, float]]:
        """FLOPs, bytes and kernels by kind (what the page and plan.json show)."""
        out: dict[str, dict[str, float]] = {}
        for op, weight in self.weighted():
            row = out.setdefault(op.kind, {"flops": 0.0, "bytes": 0.0, "kernels": 0})
            row["flops"] += op.flops * weight
            row["bytes"] += op.bytes * weight
            row["kernels"] += op.kernels * weight
        return out

    @property
    def flops(self) -> float:
        return sum(op.flops * weight for op, weight in self.weighted() if op.phase == "forward_backward")

    def arrays(self, tf32_matmul: bool) -> _Arrays:
        """The ops as numpy columns: a fit evaluates thousands of factor sets on one trace (kept on the instance:
        hashing thousands of ops per call would cost more than the arithmetic)."""
        cache = self.__dict__.setdefault("_arrays", {})  # beside the frozen fields: not part of eq or hash
        if tf32_matmul not in cache:
            cache[tf32_matmul] = _arrays(self, tf32_matmul)
        return cache[tf32_matmul]


def repeated(fewer: StepOps, more: StepOps, extra: int, blocks: int) -> StepOps:
    """The step of a model with `blocks` more repeated blocks than `more`, which has `extra` more than `fewer`:
    every operator's time is linear in the number of blocks (a block's own operators repeat; the optimizer's
    multi-tensor kernels grow with the parameters), so the step is `more` plus blocks/extra times (more -
    fewer), operators weighted (negative weights cancel `fewer`'s operators that `more` repeats)."""
    scale = blocks / extra
    return StepOps(more.ops + fewer.ops, more.samples,
                   tuple(w * (1 + scale) for _, w in more.weighted()) + tuple(-w * scale for _, w in fewer.weighted()))


def _arrays(step: StepOps, tf32_matmul: bool) -> _Arrays:
    import numpy as np

    keys = [peak_key(op, tf32_matmul) for op in step.ops]
    peak_keys = tuple(sorted(set(keys)))
    return _Arrays(np.array([KINDS.index(op.kind) for op in step.ops], dtype=int),
                   np.array([peak_keys.index(k) for k in keys], dtype=int), peak_keys,
                   np.array([op.flops for op in step.ops]), np.array([op.bytes for op in step.ops]),
                   np.array([op.kernels for op in step.ops]),
                   np.array([op.phase == "optimizer" for op in step.ops], dtype=int),
                   np.array(step.weights if step.weights is not None else [1.0] * len(step.ops)))


@dataclass(frozen=True)
class GpuFactors:
    """What a GPU reaches of its datasheet, fitted to published training results."""

    # achieved / peak for dense convolutions (forward and both backward kernels); above 1 where cuDNN takes Winograd or
    # FFT algorithms, which multiply less than the direct count torch.utils.flop_counter makes
    conv: float
    matmul: float  # achieved / (peak x the preset's matmul kernel_share, 1 where it has none) for matrix products
    memory: float  # achieved / memory bandwidth for elementwise kernels and reductions (and every class's bytes)
    launch_us: float  # per kernel, on the GPU: launch and the gap between kernels
    sync_cv: float  # rank-to-rank variation of a step's time, for ranks that wait for each other
    nchw: float = 0.0  # a tensor-core convolution on NCHW tensors moves this many times its bytes more (layout changes)
    grouped: float = 0.5  # achieved / peak for grouped convolutions
    depthwise: float = 0.5  # achieved / memory bandwidth for depthwise convolutions
    norm: float = 0.5  # achieved / memory bandwidth for normalisations (their bytes counted once: two passes show here)
    # achieved / (peak x the preset's attention kernel_share: FlashAttention-2's best there) for fused attention,
    # forward and backward: fitted to the published language-model runs (bench/published_llm.py --fit); 0.5 where a
    # fit has none (the image results run no fused attention)
    attention: float = 0.5
    # the CPU's side of eager execution, per kernel: it runs ahead of the GPU, so a step takes the longer of the two.
    # Assumed, not fitted (every published case is GPU-bound, so none can tell it); the GPU check measures it
    dispatch_us: float = 10.0
    # the share of a collective's time under compute that the compute hides (1: all of it; fitted where published
    # runs overlap communication: DDP's buckets, FSDP's gathers)
    overlap: float = 1.0
    log_sd: float = 0.0  # SD of log(predicted / published) where the fit had not seen the case: the band's width
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

def conv_backward_flop(grad_out_shape: Any, x_shape: Any, w_shape: Any, _bias: Any, _stride: Any, _padding: Any,
                       _dilation: Any, transposed: bool, _output_padding: Any, _groups: Any, output_mask: Any,
                       out_shape: Any = None, **_kwargs: Any) -> int:
    """A convolution's backward FLOPs: its forward's for each gradient it computes (input's, weight's). torch's
    own formula (torch.utils.flop_counter.conv_backward_flop) counts a grouped convolution's weight gradient as if
    it were dense, `groups` times too many: 64x for a depthwise 3x3 over 64 channels."""
    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed=transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _attention_flops(query: Any, key: Any, value: Any) -> int:
    """QK^T and PV of fused attention: 2 x b x heads x s_q x s_k x (d + d_v), as torch counts its CUDA kernels'."""
    batch, heads, s_q, d = query
    return 2 * batch * heads * s_q * key[-2] * (d + value[-1])


def cpu_flash_attention_flop(query: Any, key: Any, value: Any, *_args: Any, out_shape: Any = None,
                             **_kwargs: Any) -> int:
    """The fused attention a CPU trace takes (SDPA's flash kernel for the CPU), counted as torch counts the CUDA
    flash kernel: torch.utils.flop_counter has no formula for it, so it counted 0."""
    return _attention_flops(query, key, value)


def cpu_flash_attention_backward_flop(_grad_out: Any, query: Any, key: Any, value: Any, *_args: Any,
                                      out_shape: Any = None, **_kwargs: Any) -> int:
    """Its backward: the four products of the gradients, twice the forward (torch's count for the CUDA kernels)."""
    return 2 * _attention_flops(query, key, value)


FLOP_FORMULAS = {torch.ops.aten.convolution_backward: conv_backward_flop,  # FlopCounterMode(custom_mapping=...)
                 torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash_attention_flop,
                 torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
                     cpu_flash_attention_backward_flop}
_FORMULAS = {**flop_registry, **{op: shape_wrapper(f) for op, f in FLOP_FORMULAS.items()}}


def _kind(name: str, args: Any = (), kwargs: Mapping[str, Any] | None = None) -> str:
    """The operator class of an aten operator called with `args` (convolutions told apart by their groups)."""
    if name in CONV_OPS:
        return _conv_kind(name, args, kwargs or {})
    if name in MATMUL_OPS:
        return "matmul"
    if name.startswith(ATTENTION_PREFIX):
        return "attention"
    if any(norm in name for norm in NORM_NAMES):
        return "norm"
    if name in REDUCTION_OPS:
        return "reduction"
    return "elementwise"


def _conv_kind(name: str, args: Any, kwargs: Mapping[str, Any]) -> str:
    index = GROUPS_ARG.get(name)
    groups = kwargs.get("groups", args[index] if index is not None and len(args) > index else 1)
    weight = args[WEIGHT_ARG.get(name, 1)] if len(args) > WEIGHT_ARG.get(name, 1) else None
    if int(groups) <= 1 or not isinstance(weight, torch.Tensor):
        return "conv"
    return "conv_depthwise" if weight.shape[1] == 1 else "conv_grouped"  # weight: (out, in / groups, *kernel)


def _tensor_bytes(values: Any) -> tuple[float, int]:
    """Bytes of every tensor in `values` (nested lists included), and how many tensors."""
    tensors = [t for t in tree_flatten(values)[0] if isinstance(t, torch.Tensor)]
    return float(sum(t.numel() * t.element_size() for t in tensors)), len(tensors)


class OperatorRecorder(TorchDispatchMode):
    """Records each aten operator the step dispatches (views and allocations launch nothing, and are left out).
    Operators inside a fused kernel's mark (harness.core.fusion.one_kernel) are one operator: their FLOPs, the
    bytes they read of tensors made before it and write into them, one launch (what they make and drop inside
    stays on chip)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[OpCost] = []
        self.phase = "forward_backward"
        self.recording = True
        self._fused: _Fused | None = None

    def __exit__(self, *exc: Any) -> Any:
        self._close()
        return super().__exit__(*exc)

    def _close(self) -> None:
        if self._fused is not None:
            f, self._fused = self._fused, None
            self.ops.append(OpCost(f.kernel.kind, f.dtype, f.phase, f.flops, f.bytes + f.kernel.written, 1.0))

    def _fuse(self, kernel: fusion.Kernel, args: Any, kwargs: Any, out: Any, flops: float, dtype: str) -> None:
        if self._fused is None or self._fused.kernel is not kernel:
            self._close()
            self._fused = _Fused(kernel, self.phase, dtype)
        fused = self._fused
        fused.flops += flops
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        read_from = {_storage(t) for t in inputs}
        for tensor in inputs:  # read from memory: what existed before the kernel, once
            key = _storage(tensor)
            if key not in fused.made and key not in fused.read:
                fused.read.add(key)
                fused.bytes += tensor.numel() * tensor.element_size()
        for tensor in (t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)):
            key = _storage(tensor)
            if key in read_from and key not in fused.made:  # written in place into memory from before: once
                if key not in fused.written:
                    fused.written.add(key)
                    fused.bytes += tensor.numel() * tensor.element_size()
            else:
                fused.made.add(key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if not self.recording or func.is_view or name in NO_KERNEL_OPS or func.namespace != "aten":
            return out  # prim::device, the profiler's marks: no kernel
        read, _ = _tensor_bytes((args, kwargs))
        lists = max((len(a) for a in args if isinstance(a, list | tuple)), default=0)
        written, _ = _tensor_bytes(out)
        counter = _FORMULAS.get(func.overloadpacket)
        flops = float(counter(*args, **kwargs, out_val=out)) if counter else 0.0
        first = next((t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
        dtype = str(first.dtype).removeprefix("torch.") if first is not None else "float32"
        # a multi-tensor kernel's launches: one, and one more per FOREACH_TENSORS_PER_LAUNCH further tensors (affine in
        # the tensors, so that a step of many blocks grown from fewer, harness.prediction.gpu_model.repeated, counts them)
        kernels = 1 + (lists - 1) / FOREACH_TENSORS_PER_LAUNCH if name.startswith("_foreach") and lists else 1.0
        causal = CAUSAL_ARG.get(name)
        if causal is not None and len(args) > causal and args[causal] is True:
            flops /= 2  # a causal flash kernel skips the score blocks above the diagonal (torch counts them all)
        kernel = fusion.current()
        if kernel is not None:
            self._fuse(kernel, args, kwargs, out, flops, dtype)
            return out
        self._close()
        self.ops.append(OpCost(_kind(name, args, kwargs), dtype, self.phase, flops, read + written, kernels))
        return out

    @contextlib.contextmanager
    def phase_of(self, phase: str) -> Iterator[None]:
        self._close()
        previous, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = previous


@dataclass
class _Fused:
    """A fused kernel being recorded: storages it made, read and wrote over (by identity), its FLOPs and the bytes
    it read and wrote over (its declared outputs are the kernel's own count)."""

    kernel: fusion.Kernel
    phase: str
    dtype: str
    flops: float = 0.0
    bytes: float = 0.0
    made: set[int] = dataclasses.field(default_factory=set)
    read: set[int] = dataclasses.field(default_factory=set)
    written: set[int] = dataclasses.field(default_factory=set)


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


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
    or a float32 matrix product where TF32 is allowed (torch.backends.cuda.matmul.allow_tf32); CUDA cores'
    (float32's) for a class without tensor cores."""
    if op.kind == "conv_depthwise":
        return "float32"
    if not OPERATOR_CLASSES[op.kind].tensor_cores:
        return op.dtype
    if op.dtype != "float32":
        return op.dtype
    return "tf32" if op.kind.startswith("conv") or tf32_matmul else "float32"


def step_time(step: StepOps, peaks: Mapping[str, float], memory_gbps: float, factors: GpuFactors,
              tf32_matmul: bool = False, channels_last: bool = False,
              kernel_share: Mapping[str, float] | None = None) -> GpuTime:
    """One step of one device, each operator at its roofline time and a launch each. `peaks`: TFLOP/s per
    dtype (`tf32` absent: float32's). Tensor-core convolutions (half types, TF32) on NCHW tensors (torch's default
    layout) pay the layout changes those kernels make, a fitted multiple of their bytes; channels_last ones do
    not. A depthwise convolution's FLOPs go at the CUDA cores' (float32) peak: only its bytes are scaled.
    `kernel_share` (a preset's, by compute factor: matmul, attention): the share of the peak a published benchmark
    of the device's best kernel reached; the fitted factor is then a share of that, so one factor serves GPUs
    whose kernels reach different shares of their datasheets (an H100's matmuls 80 %, an A100's 86 %)."""
    import numpy as np

    arrays = step.arrays(tf32_matmul)
    rates = np.array([peaks.get(key) or peaks["float32"] for key in arrays.peak_keys]) * 1e12
    classes = list(OPERATOR_CLASSES.values())
    shares = kernel_share or {}
    efficiency = np.array([getattr(factors, c.compute) * shares.get(c.compute, 1.0) if c.compute else 1.0
                           for c in classes])
    computes = np.array([c.compute is not None or k == "conv_depthwise" for k, c in OPERATOR_CLASSES.items()])
    bandwidth = np.array([getattr(factors, c.bandwidth) for c in classes]) * memory_gbps * 1e9
    compute = np.where(computes[arrays.kind], arrays.flops / (rates[arrays.peak] * efficiency[arrays.kind]), 0.0)
    seconds = np.maximum(compute, arrays.bytes / bandwidth[arrays.kind])
    if not channels_last:
        tensor_cores = np.array([key in ("float16", "bfloat16") or (key == "tf32" and "tf32" in peaks)
                                 for key in arrays.peak_keys])[arrays.peak]
        layout = np.array([k in ("conv", "conv_grouped") for k in KINDS])[arrays.kind]
        seconds = seconds + layout * tensor_cores * arrays.bytes * factors.nchw / bandwidth[arrays.kind]
    kernels = arrays.kernels * arrays.weight
    seconds = seconds * arrays.weight
    launches = kernels * factors.launch_us * 1e-6
    total = seconds + launches
    by_kind = {kind: float(seconds[arrays.kind == i].sum()) for i, kind in enumerate(KINDS)}
    phases = [max(float(total[arrays.optimizer == k].sum()),
                  float(kernels[arrays.optimizer == k].sum()) * factors.dispatch_us * 1e-6) for k in (0, 1)]
    return GpuTime(phases[0], phases[1], by_kind, float(launches.sum()), round(float(kernels.sum())))


@dataclass(frozen=True)
class _Arrays:
    kind: Any  # index into KINDS
    peak: Any  # index into peak_keys
    peak_keys: tuple[str, ...]
    flops: Any
    bytes: Any
    kernels: Any
    optimizer: Any  # 1 for the optimizer's step
    weight: Any  # how many times each operator counts (StepOps.weights)


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
