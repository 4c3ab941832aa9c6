"""The peak of live tensor bytes in this process, as the CPU allocator reports them to torch's profiler.

On a GPU the caching allocator keeps its own peak (torch.cuda.max_memory_allocated); the CPU allocator
keeps none, so a rank's peak on CPU is read from the allocation and free events torch's profiler records with
`profile_memory=True` (each carries its address and signed size; c10's ProfiledCPUMemoryReporter emits them
for every CPU allocation while profiling is on, and for the free of any block it saw allocated, in this
session or an earlier one). Counting only the frees of blocks allocated in this session, the running sum is
the bytes alive that were allocated since it started; its maximum is the peak. (A block of an earlier
session freed in this one would otherwise lower the sum: a second probe in one process measured a
resnet18's peak at half its size.) The reporter sees a free only on a thread the profiler watches: a block
whose last reference a library thread drops (gloo's workers, holding a functional collective's output until
its work is released) is freed unseen. An address handed out again while its block still counts as live
proves that free: the block is counted freed then, at the latest (strategy=tp on 2 ranks measured 1.0-1.6
MiB of all-reduce outputs alive twice over without this). A free seen nowhere and never reused stays
counted: the peak is an upper bound where a library frees on its own threads. This instrument sits below
every Python-level tracker (the predictor's fake tensors never reach it), so it checks predictions
independently. It runs from before the model is built to the end of the second iteration: warm-up, never
a timed window."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from torch._C._profiler import _EventType
from torch.autograd.profiler import profile


class TensorPeak:
    def __init__(self) -> None:
        self._profile: profile | None = None
        self.peak_bytes: int | None = None
        self.end_bytes: int | None = None

    def start(self) -> TensorPeak:
        # the autograd profiler that torch.profiler.profile wraps: the wrapper's `hasattr(torch, "_inductor")`
        # (torch/profiler/profiler.py, prepare_trace) imports inductor and dynamo, 2 s of every rank's start-up
        self._profile = profile(use_cpu=True, profile_memory=True, record_shapes=False)
        self._profile.__enter__()
        return self

    def stop(self) -> int | None:
        """Stop profiling; the peak in bytes (None if never started or already read)."""
        if self._profile is None:
            return self.peak_bytes
        prof, self._profile = self._profile, None
        prof.__exit__(None, None, None)
        self.peak_bytes, self.end_bytes = peak_of(
            (node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size)
            for node in _nodes(prof.kineto_results.experimental_event_tree())
            if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu")
        return self.peak_bytes


def _nodes(roots: Iterable[Any]) -> Iterator[Any]:
    """Every node of torch.profiler's event tree (what torch.profiler._memory_profiler reads, too)."""
    stack = list(roots)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def peak_of(events: Iterable[tuple[int, int, int]]) -> tuple[int, int]:
    """(peak, final) of the running sum of signed sizes, in time order, of (time, address, signed size)
    events; a free counts only where its block's allocation is among them, and an allocation at an address
    still live frees the block there first (its free went unseen, on another thread)."""
    live = peak = 0
    allocated: dict[int, int] = {}
    for _, address, nbytes in sorted(events, key=lambda e: e[0]):
        if nbytes > 0:
            live -= allocated.pop(address, 0)
            allocated[address] = nbytes
        elif allocated.pop(address, None) is None:
            continue  # allocated before this session
        live += nbytes
        peak = max(peak, live)
    return peak, live
