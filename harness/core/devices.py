"""What both sides know of devices: a run's Placement (derived by the parent, handed to every worker),
a rank's DeviceOps (where tensors go, how to wait, what the allocator saw) and whether this CPU has native
half kernels. The parent's side (probing the hardware, placing ranks) is harness.launch.placement."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from harness.core.amp_levels import CPU_HALF_MODES  # noqa: F401  (what amp.cpu_half may say)

OUT_OF_MEMORY_MARKERS = (
    "CUDA out of memory",  # the caching allocator, when re-raised as a plain RuntimeError
    "Cuda failure 'out of memory'",  # NCCL (e.g. DistBackendError from a collective)
    "CUDA error: out of memory",  # a kernel launch or cudaMalloc outside the allocator
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)



@dataclass(frozen=True)
class AllocatorPeak:
    """torch's caching-allocator peaks on one device (GPU only: the CPU allocator keeps none)."""

    device: str
    max_allocated_mib: float
    max_reserved_mib: float


HALF_CHECKS = {"bfloat16": "_is_mkldnn_bf16_supported", "float16": "_is_mkldnn_fp16_supported"}


@functools.cache
def cpu_has_native_half(dtype: str) -> bool | None:
    """Whether oneDNN has native `dtype` kernels on this CPU (AVX-512 for bfloat16, AVX-512-FP16 or AMX for
    float16): the hardware's answer, whatever amp.cpu_half says. None: this torch cannot tell."""
    check = HALF_CHECKS.get(dtype)
    if check is None:
        return None
    try:
        return bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):
        return None


def cpu_half_reason(dtype: str, treat_as: str = "auto") -> str | None:
    """Why `dtype` on this CPU would time emulated kernels (None where it has native ones, or where
    `treat_as` (amp.cpu_half) says to take it as having them). Emulated half convolutions run tens of times
    slower than fp32 (30x for resnet18 on an AVX2-only host, docs/strategies.md), so O1-O3 would measure the
    emulation. `treat_as="emulated"` answers as a CPU without native kernels would, on any host."""
    if dtype not in HALF_CHECKS or treat_as == "native":
        return None
    native = cpu_has_native_half(dtype)
    if treat_as == "emulated":
        what = "this CPU is taken as having no native {0} kernels (amp.cpu_half=emulated)"
    elif native is False:
        what = f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no native {{0}} kernels"
    else:  # native, or a torch that cannot tell: do not refuse
        return None
    return (what.format(dtype) + ", so O1-O3 would time emulated convolutions (tens of times slower than fp32), "
            "not mixed precision; amp.allow_emulated=true runs it anyway")


def cpu_half_kernels(dtype: str, treat_as: str = "auto") -> str:
    """Which kernels this CPU's convolutions and matrix products in `dtype` take: `onednn` (native), or `aten`,
    ATen's reference kernels (im2col and a generic GEMM), which is what torch runs for a half type oneDNN has
    no native kernels for (`use_mkldnn` in aten/src/ATen/native/Convolution.cpp asks
    `mkldnn_bf16_device_check()`). `treat_as="emulated"` is honoured on a CPU with native kernels too (oneDNN
    is turned off for the run: `emulated_half_scope`); `native` cannot be, on a CPU without them."""
    if dtype not in HALF_CHECKS:
        return "onednn"
    return "aten" if treat_as == "emulated" or cpu_has_native_half(dtype) is False else "onednn"


def emulated_half_scope(dtype: str, treat_as: str) -> contextlib.AbstractContextManager[Any]:
    """Held over a run computing in `dtype` on the CPU: with amp.cpu_half=emulated on a CPU that has native
    kernels, oneDNN off, so its convolutions and matrix products take the kernels (and keep the temporaries)
    that a CPU without native half kernels takes. A no-op everywhere else."""
    if treat_as == "emulated" and cpu_has_native_half(dtype):
        return _onednn_off()
    return contextlib.nullcontext()


@contextlib.contextmanager
def _onednn_off() -> Iterator[None]:
    """torch.backends.mkldnn.enabled off, nothing else (its `flags()` would also set oneDNN's TF32 switch)."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


@dataclass(frozen=True)
class Placement:
    """Where a run's processes go. Derived once in the parent and handed to every worker."""

    accelerator: str  # "cuda" or "cpu"
    gpus: tuple[int, ...]  # physical ids used, in rank order; () on CPU
    torch_indices: tuple[int, ...]  # the same GPUs as torch numbers them inside the worker process
    nprocs: int  # worker processes on this node
    one_process_per_device: bool
    devices: tuple[str, ...]  # labels by physical id: cuda:3, or cpu / cpu:<rank>
    threads_per_process: int
    global_batch: int
    worker_env: dict[str, str] = field(default_factory=dict)
    gpu_tokens: tuple[str, ...] = ()  # CUDA_VISIBLE_DEVICES tokens of `gpus` (UUIDs stay UUIDs)
    explicit_gpus: bool = False  # the user named the GPUs (gpus=[...]) rather than taking all
    notes: tuple[str, ...] = ()
    nodes: int = 1  # > 1 only under a multi-node torchrun; `nprocs` and `devices` are this node's
    node_rank: int = 0
    batch_group: int = 1  # consecutive ranks that train on one share of the batch (a tensor-parallel group)

    @property
    def world_size(self) -> int:
        return self.nprocs * self.nodes

    @property
    def data_shards(self) -> int:
        """The shares the global batch is cut into: one a rank, or one a tensor-parallel group."""
        return self.world_size // self.batch_group

    def data_shard(self, rank: int) -> int:
        """The share rank `rank` reads: its own, or its tensor-parallel group's (every rank of it the same)."""
        return rank // self.batch_group

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.data_shards

    def rank_device(self, local_rank: int) -> str:
        """The device label a rank drives (one-process strategies: the first, i.e. base, device)."""
        return self.devices[local_rank] if self.one_process_per_device else self.devices[0]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Placement:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})



class DeviceOps:
    """What a rank needs from its devices: where tensors go, how to wait, what the allocator saw."""

    def __init__(self, accelerator: str, torch_indices: Sequence[int], labels: Sequence[str] = ()) -> None:
        self.accelerator = accelerator
        self.indices = list(torch_indices)
        self.labels = list(labels) or [f"{accelerator}:{i}" for i in self.indices]  # physical ids, for reports
        if accelerator == "cuda":
            torch.cuda.set_device(self.indices[0])  # before anything is created: no stray context on GPU 0
            self.device = torch.device("cuda", self.indices[0])
        else:
            self.device = torch.device("cpu")

    @property
    def dist_backend(self) -> str:
        return "nccl" if self.accelerator == "cuda" else "gloo"

    def synchronize(self) -> None:
        """Wait for every device this process drives (DataParallel drives several)."""
        if self.accelerator == "cuda":
            for index in self.indices:
                torch.cuda.synchronize(index)

    def reset_peaks(self) -> None:
        if self.accelerator == "cuda":
            for index in self.indices:
                torch.cuda.reset_peak_memory_stats(index)

    def allocator_peaks(self) -> list[AllocatorPeak]:
        """torch's caching-allocator peaks per device (GPU only: the CPU allocator keeps none)."""
        if self.accelerator != "cuda":
            return []
        mib = 2**20
        return [AllocatorPeak(label, torch.cuda.max_memory_allocated(i) / mib, torch.cuda.max_memory_reserved(i) / mib)
                for i, label in zip(self.indices, self.labels, strict=True)]

    @staticmethod
    def is_out_of_memory(error: BaseException) -> bool:
        """Out of memory, however it arrives: the allocator's own error, or a library that ran out inside
        (NCCL's "Cuda failure 'out of memory'", cuBLAS/cuDNN handles that could not be allocated)."""
        seen: set[int] = set()
        while error is not None and id(error) not in seen:
            seen.add(id(error))
            if isinstance(error, torch.OutOfMemoryError | MemoryError):
                return True
            if any(marker in str(error) for marker in OUT_OF_MEMORY_MARKERS):
                return True
            error = error.__cause__ or error.__context__
        return False
