"""What torch's CUDA caching allocator reserves for a traced step: its rules replayed on the step's allocations.

The allocator (c10/cuda/CUDACachingAllocator.cpp, its defaults: no expandable segments, no max_split_size) rounds
each request up to a multiple of 512 bytes; serves requests of up to 1 MiB from 2 MiB segments and larger ones from
20 MiB segments, or from a segment of their own rounded up to 2 MiB from 10 MiB up; takes the smallest cached free
block that fits; splits it when the rest is worth keeping (512 bytes or more of a small block, more than 1 MiB of a
large one); and keeps a freed block cached, merged with the free blocks beside it in its segment. What it reserves
beyond the bytes tensors hold is that rounding and the cached blocks no later request fits. Replayed in the step's
own order of allocations and frees (recorded on meta or fake tensors by AllocationRecorder), it gives the reserved
peak a GPU run would show as torch.cuda.max_memory_reserved, where a flat share would be a guess."""

from __future__ import annotations

import bisect
import itertools
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

MIN_BLOCK = 512  # kMinBlockSize: every request rounded up to a multiple of it
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to 1 MiB come from the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: a small pool's segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer: a large pool's segment for requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: from here a request gets a segment of its own...
ROUND_LARGE = 2 << 20  # kRoundLarge: ...rounded up to 2 MiB


def round_size(nbytes: int) -> int:
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class _Block:
    size: int
    small: bool
    order: int  # ties between free blocks of one size: the older first
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None


@dataclass
class CachingAllocator:
    """The allocator's bookkeeping, bytes only: `malloc(key, nbytes)`, `free(key)`; the peaks it reached."""

    reserved: int = 0
    requested: int = 0  # bytes the live tensors asked for, unrounded
    peak_reserved: int = 0
    peak_requested: int = 0
    segments: int = 0
    # hand cached segments back whenever a request finds none free (what it does at the device's limit): the
    # reserved peak is then the least the step needs; False: what an unconstrained GPU would show as reserved
    tight: bool = True
    _free: dict[bool, list[tuple[int, int, _Block]]] = field(default_factory=lambda: {True: [], False: []})
    _live: dict[Any, tuple[_Block, int]] = field(default_factory=dict)
    _order: Iterable[int] = field(default_factory=itertools.count)

    def malloc(self, key: Any, nbytes: int) -> None:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        index = bisect.bisect_left(pool, (size, -1))
        if index < len(pool):
            block = pool.pop(index)[2]
        else:  # nothing cached fits: a new segment (cudaMalloc)
            if self.tight:
                self._release_free_segments()
            block = _Block(segment_size(size), small, next(self._order))
            self.reserved += block.size
            self.segments += 1
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        block.free = False
        rest = block.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            remainder = _Block(rest, small, next(self._order), prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = remainder
            block.next, block.size = remainder, size
            self._cache(remainder)
        self._live[key] = (block, nbytes)
        self.requested += nbytes
        self.peak_requested = max(self.peak_requested, self.requested)

    def free(self, key: Any) -> None:
        entry = self._live.pop(key, None)
        if entry is None:
            return
        block, nbytes = entry
        self.requested -= nbytes
        block.free = True
        for neighbour in (block.prev, block.next):  # merged with free neighbours of its segment
            if neighbour is not None and neighbour.free:
                self._uncache(neighbour)
                block.size += neighbour.size
                if neighbour is block.prev:
                    block.prev = neighbour.prev
                    if neighbour.prev is not None:
                        neighbour.prev.next = block
                else:
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._cache(block)

    def _release_free_segments(self) -> None:
        """What the allocator does before it reports out of memory: every wholly free cached segment handed back
        (release_cached_blocks), and the request tried again."""
        for small, pool in self._free.items():
            whole = [entry for entry in pool if entry[2].prev is None and entry[2].next is None]
            for entry in whole:
                self.reserved -= entry[0]
                self.segments -= 1
            self._free[small] = [entry for entry in pool if entry[2].prev is not None or entry[2].next is not None]

    def _cache(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.order, block))

    def _uncache(self, block: _Block) -> None:
        pool = self._free[block.small]
        index = bisect.bisect_left(pool, (block.size, block.order))
        del pool[index]

    @property
    def overhead(self) -> float:
        """Reserved beyond what the tensors held, at the two peaks, as a share of the tensors' peak."""
        return (self.peak_reserved - self.peak_requested) / self.peak_requested if self.peak_requested else 0.0


class AllocationRecorder(TorchDispatchMode):
    """Feeds two CachingAllocators each new storage an operator returns, and its free when the storage dies (a weak
    reference's callback: when the last tensor on it goes, as the GPU's memory would be handed back)."""

    def __init__(self) -> None:
        super().__init__()
        self.allocator = CachingAllocator(tight=True)  # at the device's limit: what must fit
        self.roomy = CachingAllocator(tight=False)  # on a device with room: what max_memory_reserved would show
        self._seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._keys = itertools.count()

    def track(self, *values: Any) -> None:
        """Tensors that exist already (parameters, gradients, optimizer state, inputs), in the order given."""
        for tensor in tree_flatten(values)[0]:
            if isinstance(tensor, torch.Tensor):
                self._track(tensor)

    def _track(self, tensor: torch.Tensor) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor subclass without storage
            return
        if storage in self._seen:
            return
        key = next(self._keys)
        self._seen[storage] = key
        for allocator in (self.allocator, self.roomy):
            allocator.malloc(key, storage.nbytes())
            weakref.finalize(storage, allocator.free, key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self._track(tensor)
        return out
