"""The parent's side of devices: which devices a run uses and how ranks map to them (probing the hardware,
placing a run or a set of workers). The records both sides share are in harness.core.devices."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from harness.core.devices import Placement
from harness.core.errors import ConfigError, Incompatible


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
          needs_cuda: bool, isolated: bool = True, torchrun: TorchrunWorld | None = None,
          tensor_parallel: int = 1) -> Placement:
    """Map a training run's `gpus`/`nprocs` to processes and devices; refuse what cannot be placed,
    including a global batch the workers cannot share evenly (`tensor_parallel` consecutive ranks share one share,
    0: every rank, strategies.tp).

    `isolated`: the workers are child processes given CUDA_VISIBLE_DEVICES = the chosen GPUs, so they
    number them 0..n-1; otherwise (inline, or under torchrun) they keep this process's numbering.
    """
    return place_workers(cfg.strategy_name, cfg.gpus, cfg.nprocs, hw, one_process_per_device=one_process_per_device,
                         drives_all_devices=drives_all_devices, needs_cuda=needs_cuda, isolated=isolated,
                         torchrun=torchrun, global_batch=cfg.batch_size, tensor_parallel=tensor_parallel)


def place_workers(name: str, requested_gpus: tuple[int, ...] | None, nprocs: int, hw: Hardware, *,
                  one_process_per_device: bool = True, drives_all_devices: bool = False, needs_cuda: bool = False,
                  isolated: bool = True, torchrun: TorchrunWorld | None = None,
                  global_batch: int | None = None, tensor_parallel: int = 1) -> Placement:
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
            if not hw.has_gpu:  # the real reason: no GPU to give, whatever gpus says
                raise Incompatible("strategy", name, "a strategy that runs on CPU workers: this one needs CUDA "
                                   "GPUs and this machine has none")
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
    group = world if tensor_parallel == 0 else tensor_parallel
    group = group if one_process_per_device and world % group == 0 else 1  # a degree that does not divide: refused
    shares = world // group  # by the strategy's own check, naming its option
    if global_batch is not None and global_batch % shares:
        lower, upper = global_batch // shares * shares, (global_batch // shares + 1) * shares
        examples = f"{lower} or {upper}" if lower else f"{upper}"
        whose = f"{world} workers" if group == 1 else f"{shares} data-parallel groups of {group} tensor-parallel ranks"
        allowed = f"a multiple of the {whose} of strategy={name}, e.g. {examples}"
        raise ConfigError("batch_size", global_batch, allowed)
    isolated = isolated and torchrun is None
    torch_indices = tuple(range(len(gpus))) if isolated else tuple(hw.visible_gpus.index(g) for g in gpus)
    return Placement(accelerator=accelerator, gpus=tuple(gpus), torch_indices=torch_indices, nprocs=nprocs,
                     one_process_per_device=one_process_per_device, devices=devices,
                     threads_per_process=threads,  # no batch: one item per worker, so local_batch stays 1
                     global_batch=world if global_batch is None else global_batch,
                     worker_env=worker_env, gpu_tokens=tokens, explicit_gpus=requested_gpus is not None, notes=tuple(notes), nodes=nodes, node_rank=node_rank,
                     batch_group=group)
