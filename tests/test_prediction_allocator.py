"""torch's CUDA caching allocator replayed (harness.prediction.allocator): its rounding, segment sizes, best fit, splits
and merges by hand-worked sequences, and what it hands back at the device's limit."""

from __future__ import annotations

import torch

from harness.prediction.allocator import AllocationRecorder, CachingAllocator, round_size, segment_size

MiB = 2**20


def test_requests_are_rounded_and_given_the_allocators_segments():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert segment_size(100) == 2 * MiB and segment_size(MiB) == 2 * MiB  # the small pool
    assert segment_size(MiB + 512) == 20 * MiB and segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB and segment_size(13 * MiB) == 14 * MiB  # own segment, 2 MiB steps


def test_small_and_middle_requests_share_segments_and_frees_merge():
    a = CachingAllocator(tight=False)
    a.malloc("s1", 100)
    a.malloc("s2", 700)  # the rest of s1's 2 MiB segment
    assert a.reserved == 2 * MiB and a.segments == 1
    a.malloc("m1", 5 * MiB)  # a 20 MiB segment...
    a.malloc("m2", 5 * MiB)  # ...whose 15 MiB rest takes it
    assert a.reserved == 22 * MiB and a.segments == 2
    a.free("m1")
    a.free("m2")  # merged back into one free 20 MiB block: a 20 MiB request needs no new segment
    a.malloc("m3", 9 * MiB)  # the merged 20 MiB block split: 11 MiB left free
    a.malloc("m4", 11 * MiB)  # which takes it exactly
    assert a.reserved == 22 * MiB
    assert a.peak_requested == 100 + 700 + 20 * MiB


def test_a_split_cached_block_leaves_a_hole_a_larger_request_cannot_use():
    """A 30 MiB tensor freed; a 20 MiB one takes its block and leaves 10 MiB free in that segment; a 15 MiB request
    fits nowhere and gets a 16 MiB segment: 46 MiB reserved for 35 MiB of tensors, 31.4 % beyond, at either limit
    (the 30 MiB segment is in use, nothing can be handed back)."""
    for tight in (False, True):
        a = CachingAllocator(tight=tight)
        a.malloc("a", 30 * MiB)
        a.free("a")
        a.malloc("b", 20 * MiB)
        a.malloc("c", 15 * MiB)
        assert a.reserved == 46 * MiB and a.peak_reserved == 46 * MiB
        assert a.overhead == (46 - 35) / 35


def test_at_the_limit_wholly_free_segments_are_handed_back():
    """A 30 MiB tensor freed, then a 40 MiB one: with room, both segments stay reserved (70 MiB); at the limit the
    free 30 MiB segment is handed back first (40 MiB)."""
    roomy, tight = CachingAllocator(tight=False), CachingAllocator(tight=True)
    for a in (roomy, tight):
        a.malloc("a", 30 * MiB)
        a.free("a")
        a.malloc("b", 40 * MiB)
    assert roomy.peak_reserved == 70 * MiB and tight.peak_reserved == 40 * MiB
    assert tight.reserved == 40 * MiB and tight.segments == 1


def test_the_recorder_sees_each_storage_once_and_its_free():
    recorder = AllocationRecorder()
    with torch.device("meta"), recorder:
        x = torch.empty(3 * MiB // 4, dtype=torch.float32)  # 3 MiB
        y = x.view(-1, 2)  # a view: no new storage
        z = x * 2  # 3 MiB more
        del x, y
        w = z + 1  # x's storage freed before w: 6 MiB at the peak, never 9
        del z, w
    allocator = recorder.allocator
    assert allocator.peak_requested == 6 * MiB and allocator.requested == 0
    assert allocator.peak_reserved == 20 * MiB  # one 20 MiB segment holds both 3 MiB tensors at a time
