"""What parameters, gradients and optimizer state take per rank in theory, beside the measured peak.

The whole model's figures are read off the objects as trained (element sizes as the amp level left them;
DTensors report their global size), then divided by the ranks sharing them for what the strategy shards (the
world size; HSDP's shard group, `StrategySpec.shard_degree`): DDP keeps everything on every rank; ZeRO (stage 1)
shards the optimizer state; FSDP all three, gradients only without grad_accum. Gradients are those alive at the optimizer step: the ones it steps with, in their dtype
(O2's fp32 master gradients: native amp converts the model's half gradients one by one and drops each, so
only the one being converted overlaps), plus the model's half ones where the amp keeps them too (apex).
Activations, buffers, communication buffers and the framework's own memory are not in the theory: the
measured peak minus the theory is roughly what they took."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

MIB = 2**20


@dataclass(frozen=True)
class Footprint:
    """Bytes for the whole (unsharded) model."""

    params: int  # the model's parameters, in the dtype they are stored in
    grads: int  # the gradients alive at the step: one per stepped parameter in its dtype (+ kept model ones)
    optimizer_state: int  # the optimizer's per-parameter state (momentum: 1 copy; Adam: 2)
    master_weights: int  # fp32 copies the optimizer steps instead of the model's half weights (O2)


def footprint(model: nn.Module, optimizer: torch.optim.Optimizer, model_grads_kept: bool = False) -> Footprint:
    """After at least one step (optimizer state is created lazily). `model_grads_kept`: the amp holds the
    model's own gradients beside the master ones at the step (Amp.keeps_model_grads_at_step)."""
    params = [p for p in model.parameters()]
    model_ids = {id(p) for p in params}
    stepped = [p for group in optimizer.param_groups for p in group["params"]]
    stepped_ids = {id(p) for p in stepped}
    size = sum(_bytes(p) for p in params)
    masters = sum(_bytes(p) for p in stepped if id(p) not in model_ids)
    grads = sum(_bytes(p) for p in stepped)  # what the optimizer steps with, in its dtype (fp32 masters at O2)
    if masters and model_grads_kept:
        grads += sum(_bytes(p) for p in params if p.requires_grad and id(p) not in stepped_ids)
    per_element = _state_bytes_per_element(getattr(optimizer, "optim", optimizer))  # ZeRO: its local optimizer
    state = sum(p.numel() for p in stepped) * per_element
    return Footprint(params=size, grads=grads, optimizer_state=state, master_weights=masters)


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _state_bytes_per_element(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of state per parameter element: the state tensors shaped like their parameter (SGD's
    momentum buffer, Adam's two moments; Adam's scalar step count is left out)."""
    for param, state in optimizer.state.items():
        tensors = [t for t in state.values() if isinstance(t, torch.Tensor) and t.shape == param.shape]
        if tensors:
            return sum(t.element_size() for t in tensors)
    return 0


def per_rank(whole: Footprint, world_size: int, shards: tuple[bool, bool, bool], grad_accum: int = 1,
             sharded_over: int | None = None) -> dict[str, Any]:
    """MiB each rank holds: a sharded part is 1/`sharded_over` of the whole, the ranks that share one copy of it
    (`StrategySpec.shard_degree`: the world size unless given, HSDP's shard group). O2's master weights are parameters
    too: sharded only where the parameters are (torch's ZeRO keeps every parameter on every rank and shards
    the state alone; FSDP's fp32 shards are its master weights already, counted as parameters). Sharded
    gradients with grad_accum > 1 are whole: FSDP2 accumulates the micro-batches' gradients unsharded and
    reduce-scatters at the last (torch/distributed/fsdp/_fully_shard/_fully_shard.py, set_requires_gradient_sync:
    "Unsynchronized gradients accumulate on unsharded parameters"); the sharded ones then come on top of them
    briefly, which the theory leaves out."""
    params, grads, state = shards
    grads = grads and grad_accum == 1
    over = world_size if sharded_over is None else sharded_over
    figures = {"params": whole.params / (over if params else 1),
               "grads": whole.grads / (over if grads else 1),
               "optimizer_state": whole.optimizer_state / (over if state else 1),
               "master_weights": whole.master_weights / (over if params else 1)}
    mib = {f"{k}_mib": v / MIB for k, v in figures.items()}
    return {**mib, "total_mib": sum(mib.values()), "world_size": world_size,
            "sharded": {"params": params, "grads": grads, "optimizer_state": state}, "whole_bytes": asdict(whole)}
