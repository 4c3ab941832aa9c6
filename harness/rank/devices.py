"""The one place that knows CUDA from CPU: which devices a run uses, how ranks map to them,
how to wait for them, and what their allocators saw. Everything else asks through here."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch

from harness.errors import ConfigError, Incompatible

OUT_OF_MEMORY_MARKERS = (
    "CUDA out of memory",  # the caching allocator, when re-raised as a plain RuntimeError
    "Cuda failure 'out of memory'",  # NCCL (e.g. DistBackendError from a collective)
    "CUDA error: out of memory",  # a kernel launch or cudaMalloc outside the allocator
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)


@dataclass(frozen=True)
class Hardware:
    visible_gpus: tuple[int, ...]  # ids the user names in gpus=[...]: physical (PCI bus order, as nvidia-smi)
    cores: int
    # CUDA_VISIBLE_DEVICES's own token for each visible GPU, in the same order: "3", or a UUID / MIG name.
    # Workers get these tokens back, so a GPU chosen by UUID stays that GPU.
    tokens: tuple[str, ...] = ()

    @property
    def has_gpu(self) -> bool:
        return bool(self.visible_gpus)

    def token(self, gpu: int) -> str:
        return self.tokens[self.visible_gpus.index(gpu)] if self.tokens else str(gpu)


@functools.cache
def cpu_half_reason(dtype: str) -> str | None:
    """Why `dtype` on this CPU would time emulated kernels (None where oneDNN has native ones: AVX-512 for
    bfloat16, AVX-512-FP16 or AMX for float16). Emulated half convolutions run tens of times slower than
    fp32 (30x for resnet18 on an AVX2-only host, docs/strategies.md), so O1-O3 would measure the emulation."""
    check = {"bfloat16": "_is_mkldnn_bf16_supported", "float16": "_is_mkldnn_fp16_supported"}.get(dtype)
    if check is None:
        return None
    try:
        native = bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):  # a torch without the check: cannot tell, do not refuse
        return None
    if native:
        return None
    return (f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no native {dtype} kernels, so O1-O3 would "
            "time emulated convolutions (tens of times slower than fp32), not mixed precision; "
            "amp.allow_emulated=true runs it anyway")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def probe_hardware() -> Hardware:
    """Count GPUs without creating a CUDA context in the parent."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ids, tokens = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), count)
    return Hardware(visible_gpus=ids, cores=usable_cores(), tokens=tokens)


def visible_gpus(cuda_visible_devices: str | None, count: int,
                 physical_index: Callable[[str], int | None] | None = None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(ids, tokens) of the GPUs behind torch's indices 0..count-1 (the user may have narrowed them already).

    Numeric tokens are physical ids. UUIDs (GPU-...) are turned into physical ids through NVML; where that
    is impossible (MIG instances, no NVML), every id is the GPU's position in CUDA_VISIBLE_DEVICES."""
    if cuda_visible_devices is None:
        return tuple(range(count)), tuple(str(i) for i in range(count))
    tokens = tuple(t.strip() for t in cuda_visible_devices.split(",") if t.strip())[:count]
    if all(t.isdigit() for t in tokens):
        return tuple(int(t) for t in tokens), tokens
    resolve = physical_index or nvml_physical_index
    resolved = [int(t) if t.isdigit() else resolve(t) for t in tokens]
    if all(i is not None for i in resolved) and len(set(resolved)) == len(resolved):
        return tuple(i for i in resolved if i is not None), tokens
    return tuple(range(len(tokens))), tokens


def nvml_physical_index(uuid: str) -> int | None:
    """nvidia-smi's index of the GPU with this UUID; None for MIG instances or without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no package, a MIG handle (no index): positions instead
        return None


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

    @property
    def world_size(self) -> int:
        return self.nprocs * self.nodes

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.world_size

    def rank_device(self, local_rank: int) -> str:
        """The device label a rank drives (one-process strategies: the first, i.e. base, device)."""
        return self.devices[local_rank] if self.one_process_per_device else self.devices[0]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Placement:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


@dataclass(frozen=True)
class TorchrunWorld:
    """What torchrun decided when it started this process (RANK, LOCAL_WORLD_SIZE, GROUP_RANK...)."""

    local_world_size: int
    nodes: int
    node_rank: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TorchrunWorld:
        world, local = int(env["WORLD_SIZE"]), int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
        return cls(local_world_size=local, nodes=max(1, world // local), node_rank=int(env.get("GROUP_RANK", 0)))


class PlacementRequest(Protocol):
    """What placing a run needs from its config (a RunConfig has it all)."""

    strategy_name: str
    gpus: tuple[int, ...] | None
    nprocs: int
    batch_size: int


def place(cfg: PlacementRequest, hw: Hardware, one_process_per_device: bool, drives_all_devices: bool,
          needs_cuda: bool, isolated: bool = True, torchrun: TorchrunWorld | None = None) -> Placement:
    """Map a training run's `gpus`/`nprocs` to processes and devices; refuse what cannot be placed,
    including a global batch the workers cannot share evenly.

    `isolated`: the workers are child processes given CUDA_VISIBLE_DEVICES = the chosen GPUs, so they
    number them 0..n-1; otherwise (inline, or under torchrun) they keep this process's numbering.
    """
    return place_workers(cfg.strategy_name, cfg.gpus, cfg.nprocs, hw, one_process_per_device=one_process_per_device,
                         drives_all_devices=drives_all_devices, needs_cuda=needs_cuda, isolated=isolated,
                         torchrun=torchrun, global_batch=cfg.batch_size)


def place_workers(name: str, requested_gpus: tuple[int, ...] | None, nprocs: int, hw: Hardware, *,
                  one_process_per_device: bool = True, drives_all_devices: bool = False, needs_cuda: bool = False,
                  isolated: bool = True, torchrun: TorchrunWorld | None = None,
                  global_batch: int | None = None) -> Placement:
    """Place workers that need no training batch (the collectives benchmark), or, given `global_batch`,
    a training run's: that batch must then split evenly over the workers. `name` says whose workers in
    refusals and notes (`strategy=<name>`)."""
    if requested_gpus is None:
        gpus = hw.visible_gpus
    else:
        gpus = requested_gpus
        stray = [g for g in gpus if g not in hw.visible_gpus]
        if stray:  # not a typo: GPUs this machine lacks (in a sweep, `skipped` rows that say so)
            allowed = (f"ids among the visible GPUs {list(hw.visible_gpus)}" if hw.has_gpu
                       else "[] or null: this machine has no visible GPU (gpus=[] runs on CPU workers)")
            raise Incompatible("gpus", list(gpus), allowed)
        if not gpus and needs_cuda:
            raise Incompatible("gpus", [], f"strategy={name} runs on GPUs: give their ids, e.g. gpus=[0,1]")

    notes: list[str] = []
    nodes, node_rank = (torchrun.nodes, torchrun.node_rank) if torchrun else (1, 0)
    prefix = f"node{node_rank}/" if nodes > 1 else ""
    if torchrun is not None:
        if gpus and len(gpus) < torchrun.local_world_size:
            raise ConfigError("gpus", list(gpus), f"at least --nproc-per-node={torchrun.local_world_size} GPUs")
        gpus = gpus[:torchrun.local_world_size]
    if gpus:
        accelerator = "cuda"
        if not one_process_per_device and not drives_all_devices and len(gpus) > 1:
            notes.append(f"strategy={name} uses one device: GPU {gpus[0]} of {list(gpus)}")
            gpus = gpus[:1]
        if drives_all_devices and len(gpus) == 1:
            notes.append(f"strategy={name} on one GPU ({gpus[0]}): a one-GPU baseline, nothing is parallelised")
        nprocs = len(gpus) if one_process_per_device else 1
        devices = tuple(f"{prefix}cuda:{g}" for g in gpus)
        tokens = tuple(hw.token(g) for g in gpus)
        worker_env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(tokens)}
    else:
        accelerator = "cpu"
        nprocs = torchrun.local_world_size if torchrun else (nprocs if one_process_per_device else 1)
        first = node_rank * nprocs
        devices = tuple(f"{prefix}cpu:{first + r}" for r in range(nprocs)) if one_process_per_device else ("cpu",)
        worker_env, tokens = {}, ()
    threads = max(1, hw.cores // nprocs)
    if one_process_per_device:
        worker_env["OMP_NUM_THREADS"] = str(threads)
    world = nprocs * nodes
    if global_batch is not None and global_batch % world:
        lower, upper = global_batch // world * world, (global_batch // world + 1) * world
        examples = f"{lower} or {upper}" if lower else f"{upper}"
        allowed = f"a multiple of the {world} workers of strategy={name}, e.g. {examples}"
        raise ConfigError("batch_size", global_batch, allowed)
    isolated = isolated and torchrun is None
    torch_indices = tuple(range(len(gpus))) if isolated else tuple(hw.visible_gpus.index(g) for g in gpus)
    return Placement(accelerator=accelerator, gpus=tuple(gpus), torch_indices=torch_indices, nprocs=nprocs,
                     one_process_per_device=one_process_per_device, devices=devices,
                     threads_per_process=threads,  # no batch: one item per worker, so local_batch stays 1
                     global_batch=world if global_batch is None else global_batch,
                     worker_env=worker_env, gpu_tokens=tokens, explicit_gpus=requested_gpus is not None, notes=tuple(notes), nodes=nodes, node_rank=node_rank)


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

    def allocator_peaks(self) -> list[dict[str, Any]]:
        """torch's caching-allocator peaks per device (GPU only: the CPU allocator keeps none)."""
        if self.accelerator != "cuda":
            return []
        mib = 2**20
        return [{"device": label, "max_allocated_mib": torch.cuda.max_memory_allocated(i) / mib,
                 "max_reserved_mib": torch.cuda.max_memory_reserved(i) / mib}
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
