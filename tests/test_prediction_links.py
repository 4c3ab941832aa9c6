"""The latency-bandwidth model of collectives (harness.prediction.links): hand-worked times that tell the right bus
factor and hop count from the plausible wrong ones, and fits that recover a link known by construction."""

from __future__ import annotations

import pytest

from harness.prediction.links import (
    Link,
    bus_factor,
    collective_seconds,
    fit_link,
    fit_links,
    hops,
    node_share,
)

NVLINK = Link(latency_us=2.0, bandwidth_gbps=100.0)


def test_all_reduce_over_four_ranks_by_hand():
    # 1 GB over 4 ranks: 2(n-1) = 6 hops x 2 us, and 2(n-1)/n = 1.5 x 1e9 bytes at 100 GB/s = 15 ms
    seconds = collective_seconds("all_reduce", 1e9, 4, 1, NVLINK, NVLINK)
    assert seconds == pytest.approx(12e-6 + 0.015)
    # the plausible wrong ones: all-gather's factor (n-1)/n would give 7.5 ms, algorithm bandwidth 10 ms
    assert seconds > 0.0140


def test_all_gather_reduce_scatter_and_broadcast_by_hand():
    assert collective_seconds("all_gather", 1e9, 4, 1, NVLINK, NVLINK) == pytest.approx(3 * 2e-6 + 0.75e9 / 100e9)
    assert collective_seconds("reduce_scatter", 8e8, 2, 1, NVLINK, NVLINK) == pytest.approx(2e-6 + 0.5 * 8e8 / 100e9)
    assert collective_seconds("broadcast", 1e9, 8, 1, NVLINK, NVLINK) == pytest.approx(7 * 2e-6 + 1e9 / 100e9)
    assert bus_factor("broadcast", 8) == 1.0 and hops("all_reduce", 8) == 14


def test_one_rank_or_nothing_sent_costs_nothing():
    assert collective_seconds("all_reduce", 1e9, 1, 1, NVLINK, NVLINK) == 0.0
    assert collective_seconds("all_reduce", 0, 8, 1, NVLINK, NVLINK) == 0.0


def test_across_nodes_the_slowest_link_and_its_latency_count():
    ib = Link(latency_us=5.0, bandwidth_gbps=40.0)
    seconds = collective_seconds("all_reduce", 1.6e9, 8, 2, NVLINK, ib)
    # 16 ranks: 30 hops in two passes round the ring, each crossing between the 2 nodes twice: 4 at 5 us, 26 at
    # 2 us; 2 x 15/16 x 1.6 GB at the slower 40 GB/s
    assert seconds == pytest.approx(26 * 2e-6 + 4 * 5e-6 + 2 * 15 / 16 * 1.6e9 / 40e9)


def test_with_one_rank_a_node_every_hop_crosses_and_no_more():
    """HSDP's replicate group, one rank on each of 4 nodes: 6 hops, all between nodes (not 2 passes x 4 nodes = 8
    crossings, which would count 2 hops' latency below zero)."""
    ib = Link(latency_us=5.0, bandwidth_gbps=40.0)
    assert collective_seconds("all_reduce", 1.6e9, 1, 4, NVLINK, ib) == pytest.approx(6 * 5e-6 + 2 * 3 / 4 * 1.6e9 / 40e9)
    assert collective_seconds("all_gather", 1.6e9, 1, 4, NVLINK, ib) == pytest.approx(3 * 5e-6 + 3 / 4 * 1.6e9 / 40e9)


def test_a_group_with_one_rank_a_node_crosses_through_its_share_of_the_nodes_link():
    """FSDP x TP 8 on 16 nodes of 8: each data-parallel group holds one rank a node, and the node's 360 GB/s is
    its 8 NICs', one a device: a group gets 45 GB/s while the other 7 groups use the rest. 101 GB of bf16
    parameters gathered over 16 ranks: 15 hops, all crossing, at 5 us, and 15/16 of it at 45 GB/s = 2.1 s (at the
    node's whole 360 GB/s, eight times faster: 0.26 s)."""
    ib = Link(latency_us=5.0, bandwidth_gbps=360.0)
    nvswitch = Link(latency_us=2.0, bandwidth_gbps=360.0)
    seconds = collective_seconds("all_gather", 101e9, 1, 16, nvswitch, ib, node_devices=8)
    assert seconds == pytest.approx(15 * 5e-6 + 15 / 16 * 101e9 / 45e9)
    # a group that fills its nodes moves the whole link; one inside a node is not touched by it
    assert collective_seconds("all_gather", 101e9, 8, 16, nvswitch, ib, node_devices=8) == pytest.approx(
        collective_seconds("all_gather", 101e9, 8, 16, nvswitch, ib))
    assert collective_seconds("all_gather", 1e9, 4, 1, nvswitch, ib, node_devices=8) == pytest.approx(
        collective_seconds("all_gather", 1e9, 4, 1, nvswitch, ib))
    assert node_share(ib, 2, 8) == Link(5.0, 90.0) and node_share(ib, 16, 8) == ib


def test_a_per_op_link_replaces_the_preset_link_inside_a_node():
    slow = {"reduce_scatter": Link(1000.0, 0.5)}
    assert collective_seconds("reduce_scatter", 1e6, 2, 1, NVLINK, NVLINK, slow) == pytest.approx(1e-3 + 0.5e6 / 0.5e9)
    assert collective_seconds("all_gather", 1e6, 2, 1, NVLINK, NVLINK, slow) == pytest.approx(2e-6 + 0.5e6 / 100e9)


def test_a_half_type_takes_its_own_fitted_link_where_there_is_one():
    fitted = {"all_reduce": Link(100.0, 2.0), "all_reduce:bfloat16": Link(100.0, 0.25)}
    fp32 = collective_seconds("all_reduce", 1e6, 2, 1, NVLINK, NVLINK, fitted, "float32")
    bf16 = collective_seconds("all_reduce", 1e6, 2, 1, NVLINK, NVLINK, fitted, "bfloat16")
    fp16 = collective_seconds("all_reduce", 1e6, 2, 1, NVLINK, NVLINK, fitted, "float16")
    assert fp32 == pytest.approx(2e-4 + 1e6 / 2e9) and bf16 == fp16 == pytest.approx(2e-4 + 1e6 / 0.25e9)
    only_fp32 = {"all_reduce": Link(100.0, 2.0)}  # no half fit: the float32 one
    assert collective_seconds("all_reduce", 1e6, 2, 1, NVLINK, NVLINK, only_fp32, "bfloat16") == pytest.approx(fp32)


def test_a_call_among_the_measured_sizes_is_priced_by_them_not_by_the_line():
    """gloo's mean calls on 2 ranks, 0.72 ms at 64 KiB, 0.86 at 256 KiB, 1.72 at 512 KiB, 12.8 at 16 MiB: a 512 KiB
    call costs 1.72 ms (the line through them, 2 x 350 us + 512 KiB at 1.39 GB/s, 1.08 ms); 384 KiB halfway
    between 256 and 512 KiB, 1.29 ms (not the line's nor either neighbour's); 4 KiB the smallest's 0.72 ms (a
    call's latency); 32 MiB, 4 ranks, or across nodes: the line."""
    sizes = ((65536, 0.72e-3), (262144, 0.86e-3), (524288, 1.72e-3), (16777216, 12.8e-3))
    gloo = Link(350.0, 1.39, sizes, ranks=2)
    per_op = {"all_reduce": gloo}

    def call(size: float, ranks: int = 2, nodes: int = 1) -> float:
        return collective_seconds("all_reduce", size, ranks // nodes, nodes, NVLINK, NVLINK, per_op)

    assert call(524288) == pytest.approx(1.72e-3)
    assert call(393216) == pytest.approx(1.29e-3)
    assert call(4096) == pytest.approx(0.72e-3)
    line = 2 * 350e-6 + 32 * 2**20 / 1.39e9
    assert call(32 * 2**20) == pytest.approx(line)
    assert call(524288, ranks=4) == pytest.approx(6 * 350e-6 + 1.5 * 524288 / 1.39e9)
    assert call(524288, ranks=4, nodes=2) == collective_seconds("all_reduce", 524288, 2, 2, NVLINK, NVLINK)
    assert Link(**{"latency_us": 350.0, "bandwidth_gbps": 1.39, "sizes": [[65536, 0.72e-3]], "ranks": 2}) == \
        Link(350.0, 1.39, ((65536.0, 0.72e-3),), 2)  # as the cache's JSON gives it


def test_a_call_after_compute_adds_what_the_link_measured_after_that_much():
    """A link that measured 0.5 ms more after 2 ms of compute and 1.0 ms after 4 ms: after 3 ms of compute a 512 KiB
    call adds 0.75 ms to its 1.72 ms (linear between the gaps), after 1 ms 0.25 (from nothing back to back), after
    10 ms the longest gap's 1.0; on other ranks, across nodes, or with no compute before it, nothing."""
    gloo = Link(350.0, 1.39, ((65536, 0.72e-3), (524288, 1.72e-3)), ranks=2,
                after_compute=((0.002, 0.5e-3), (0.004, 1.0e-3)))
    per_op = {"all_reduce": gloo}

    def call(after_s: float, ranks: int = 2, nodes: int = 1) -> float:
        return collective_seconds("all_reduce", 524288, ranks // nodes, nodes, NVLINK, NVLINK, per_op,
                                  after_s=after_s)

    assert call(0.003) == pytest.approx(1.72e-3 + 0.75e-3)
    assert call(0.001) == pytest.approx(1.72e-3 + 0.25e-3)
    assert call(0.010) == pytest.approx(1.72e-3 + 1.0e-3)
    assert call(0.0) == pytest.approx(1.72e-3)
    assert call(0.003, ranks=4) == pytest.approx(6 * 350e-6 + 1.5 * 524288 / 1.39e9)  # measured on 2 ranks only
    assert call(0.003, ranks=4, nodes=2) == collective_seconds("all_reduce", 524288, 2, 2, NVLINK, NVLINK)
    assert Link(**{"latency_us": 1.0, "bandwidth_gbps": 1.0, "after_compute": [[0.002, 5e-4]], "ranks": 2}) == \
        Link(1.0, 1.0, ranks=2, after_compute=((0.002, 5e-4),))  # as the cache's JSON gives it


def test_the_fit_recovers_a_link_known_by_construction():
    truth = Link(latency_us=150.0, bandwidth_gbps=1.5)
    samples = [(op, size, collective_seconds(op, size, 2, 1, truth, truth))
               for op in ("all_reduce", "all_gather", "broadcast") for size in (2**16, 2**20, 2**24)]
    fit = fit_link(samples, 2)
    assert fit.link.latency_us == pytest.approx(150.0, rel=1e-6)
    assert fit.link.bandwidth_gbps == pytest.approx(1.5, rel=1e-6)
    assert fit.r_squared == pytest.approx(1.0) and fit.points == 9


def test_per_op_fits_keep_each_collective_its_own_link():
    fast, slow = Link(100.0, 4.0), Link(2000.0, 0.5)
    samples = [("broadcast", s, collective_seconds("broadcast", s, 2, 1, fast, fast)) for s in (2**16, 2**20, 2**24)]
    samples += [("reduce_scatter", s, collective_seconds("reduce_scatter", s, 2, 1, slow, slow))
                for s in (2**16, 2**20, 2**24)]
    pooled, each = fit_links(samples, 2)
    assert each["broadcast"].link.bandwidth_gbps == pytest.approx(4.0, rel=1e-6)
    assert each["reduce_scatter"].link.latency_us == pytest.approx(2000.0, rel=1e-6)
    assert pooled.r_squared < 1.0  # one link cannot fit both
