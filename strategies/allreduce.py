"""Data-parallel SGD by hand: what DistributedDataParallel does, minus buckets-in-flight and overlap.

One process per device, no wrapper. `wrap` broadcasts rank 0's weights and buffers, then hooks every
parameter; when a backward pass has accumulated the gradients, each gradient is divided by the world
size and all-reduced (SUM), before the trainer calls `optimizer.step()`. The trainer never knows:
the hook runs inside `loss.backward()`.

`bucket=false` is the textbook version, one all-reduce per parameter tensor; `bucket=true` flattens
every gradient of a dtype into one buffer, all-reduces it once and copies the slices back.

Amp plugins need nothing special: gradients are reduced as backward leaves them (loss-scaled
under O1/O2, half under O2/O3), before `amp.step` unscales them or copies them to O2's fp32
master weights. Those masters are made in `amp.prepare`, before any strategy wraps the model,
so the broadcast does not reach them (nor does DDP's): the shared seed keeps them equal, as for DDP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.autograd import Variable
from torch.utils.hooks import RemovableHandle

from harness.core.traffic import Buffer, Collective, Traffic
from strategies.base import ProcessGroupStrategy
from strategies.capabilities import GradientSyncControl


class ManualAllReduce(GradientSyncControl, ProcessGroupStrategy):
    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """All-reduced after backward, waited for (no overlap): one call per parameter, or with bucket=true one
        call for all of them flattened into one copy."""
        bucket = bool(cls.options_of(options).get("bucket"))
        buffers = (Buffer("grads"),) if bucket else ()
        return Traffic((Collective("all_reduce", "grads", "none", calls="whole" if bucket else "per_param"),), buffers)

    def __init__(self, bucket: bool = False) -> None:
        super().__init__()
        self.bucket = bucket
        self._params: list[nn.Parameter] = []
        self._handles: list[RemovableHandle] = []
        self._queued = False
        self._sync = True  # False inside no_sync (grad_accum): gradients only accumulate locally

    def wrap(self, model: nn.Module) -> nn.Module:
        """Same weights everywhere, then gradients averaged after every backward: replicas stay equal."""
        broadcast_from_rank0(list(model.parameters()) + list(model.buffers()))
        self._params = [p for p in model.parameters() if p.requires_grad]
        # A per-parameter hook fires once that parameter's .grad is final for this backward pass; the
        # first one queues `_reduce_gradients` to run when the whole backward has finished (as DDP's
        # reducer does), so every .grad exists and is reduced once, whatever order autograd took.
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self._params]
        return model

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if self._sync and not self._queued:
            self._queued = True
            Variable._execution_engine.queue_callback(self._reduce_gradients)

    def _reduce_gradients(self) -> None:
        self._queued = False
        for p in self._params:
            if p.grad is None:  # unused this step here, maybe not elsewhere: every rank must call alike
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self._params]
        if self.bucket:
            all_reduce_mean_bucketed(grads)
        else:
            all_reduce_mean(grads)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return self._accumulate_only()

    @contextlib.contextmanager
    def _accumulate_only(self) -> Iterator[None]:
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def teardown(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        super().teardown()


def broadcast_from_rank0(tensors: Iterable[torch.Tensor]) -> None:
    """Rank 0's values into every rank's tensors, in place (the seed is shared, but never trust it)."""
    with torch.no_grad():
        for tensor in tensors:
            dist.broadcast(tensor, src=0)


# Both divide by the world size BEFORE summing, as torch's own DDP hook does "to avoid overflow, especially
# for FP16" (torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py): loss-scaled float16 gradients
# summed over 8 ranks first can overflow where DDP's would not, and the comparison would be unfair.

def all_reduce_mean(grads: Iterable[torch.Tensor]) -> None:
    """The textbook loop: one all-reduce per tensor."""
    world = dist.get_world_size()
    for grad in grads:
        grad.div_(world)
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)


def all_reduce_mean_bucketed(grads: list[torch.Tensor]) -> None:
    """One flat buffer per (device, dtype) (O2 keeps batch-norm fp32 beside half weights), one all-reduce."""
    world = dist.get_world_size()
    for group in _same_kind(grads):
        flat = _flatten_dense_tensors(group)
        flat.div_(world)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for grad, synced in zip(group, _unflatten_dense_tensors(flat, group), strict=True):
            grad.copy_(synced)


def _same_kind(tensors: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    yield from groups.values()
