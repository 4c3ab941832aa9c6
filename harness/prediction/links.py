"""The latency-bandwidth (alpha-beta) model of ring collectives, and its fit to measured timings.

A ring collective over n ranks takes `steps` hops of latency alpha and moves `bus_factor x S` bytes through
each rank's link at bus bandwidth B (NVIDIA nccl-tests' definition, doc/PERFORMANCE.md): all_reduce
2(n-1)/n and 2(n-1) hops (reduce-scatter then all-gather), all_gather and reduce_scatter (n-1)/n and n-1
hops, broadcast 1 and n-1 hops (pipelined). S is the full buffer (for all_gather and reduce_scatter, every
rank's share together). Across nodes the ring is as fast as its slowest link: the inter-node bus bandwidth,
with the hops that cross nodes paying the inter-node latency."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

GB = 1e9


@dataclass(frozen=True)
class Link:
    """A link's latency and bandwidth; this machine's measured one also keeps each size's mean call on the ranks
    it was measured over (`sizes`: (bytes, seconds), ascending; `ranks`), which price a call of those ranks
    between the smallest and the largest size: gloo's mean call is no straight line in its size (2 ranks on a
    2-core VM, 2026-12-07: 0.72 ms at 64 KiB, 0.86 at 256 KiB, 1.72 at 512 KiB, 2.18 at 1 MiB, 12.8 at 16 MiB,
    the line fitted to them 1.33 ms at 512 KiB: where tensor parallelism's calls are, and FSDP's). It keeps too
    what a call adds right after compute (`after_compute`: (seconds of compute, seconds added), ascending): on this
    VM a call made after 2 ms of compute took 0.2-0.7 ms longer than after a barrier, after 4 ms 0.6-1.0 ms, whatever
    its op or size, and back to back no longer (benchmarks/link_after_compute.md)."""

    latency_us: float  # one hop
    bandwidth_gbps: float  # bus bandwidth, GB/s (1e9 bytes/s)
    sizes: tuple[tuple[float, float], ...] = ()
    ranks: int = 0
    after_compute: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:  # read from JSON: lists
        object.__setattr__(self, "sizes", tuple((float(b), float(t)) for b, t in self.sizes))
        object.__setattr__(self, "after_compute", tuple((float(g), float(t)) for g, t in self.after_compute))

    def added_after(self, compute_s: float, n: int) -> float:
        """What a call over `n` ranks made after `compute_s` of compute adds to its measured time: linear between
        the measured gaps, from nothing at none (a call back to back adds nothing), the longest gap's beyond it; 0
        where none was measured, or on other ranks."""
        if not self.after_compute or n != self.ranks or compute_s <= 0:
            return 0.0
        below = (0.0, 0.0)
        for above in self.after_compute:
            if compute_s <= above[0]:
                return below[1] + (compute_s - below[0]) / (above[0] - below[0]) * (above[1] - below[1])
            below = above
        return below[1]

    def measured_seconds(self, size_bytes: float, n: int) -> float | None:
        """A call of `size_bytes` over `n` ranks as measured: between two measured sizes, linear in the size; at
        or below the smallest, the smallest's (small calls cost their latency); None above the largest, on
        other ranks, or with no sizes (the line prices it)."""
        if not self.sizes or n != self.ranks or size_bytes > self.sizes[-1][0]:
            return None
        below = self.sizes[0]
        if size_bytes <= below[0]:
            return below[1]
        for above in self.sizes[1:]:
            if size_bytes <= above[0]:
                share = (size_bytes - below[0]) / (above[0] - below[0])
                return below[1] + share * (above[1] - below[1])
            below = above
        return None


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {op}")


def hops(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def collective_seconds(op: str, size_bytes: float, devices_per_node: int, nodes: int, intra: Link,
                       inter: Link, per_op: Mapping[str, Link] | None = None, dtype: str = "float32",
                       node_devices: int = 0, after_s: float = 0.0) -> float:
    """One collective over devices_per_node x nodes ranks (0 for one rank). `per_op`: a link fitted to each op
    apart, and for half types to each op and dtype (`all_reduce:bfloat16`; this machine's: gloo's algorithms
    differ from op to op, and it reduces half types far slower than float32), used in place of `intra` inside a
    node. `node_devices`: the devices a node has, where the group holds fewer of them (0: it fills its nodes);
    see `node_share`. A link that kept its measured sizes prices a call among them by them (Link.measured_seconds).
    `after_s`: the compute just before the call, which a link that measured it adds (Link.added_after).
    """
    n = devices_per_node * nodes
    if n <= 1 or size_bytes <= 0:
        return 0.0
    if per_op and nodes == 1:
        keys = [f"{op}:bfloat16", op] if dtype in ("bfloat16", "float16") else [op]  # float16 as the other half type
        intra = next((per_op[k] for k in keys if k in per_op), intra)
    added = intra.added_after(after_s, n) if nodes == 1 else 0.0
    measured = intra.measured_seconds(size_bytes, n) if nodes == 1 else None
    if measured is not None:
        return measured + added
    if node_devices:
        inter = node_share(inter, devices_per_node, node_devices)
    bandwidth = intra.bandwidth_gbps if nodes == 1 else min(intra.bandwidth_gbps, inter.bandwidth_gbps)
    total_hops = hops(op, n)
    passes = total_hops // (n - 1)  # all_reduce: two passes round the ring (reduce-scatter, all-gather)
    # each pass crosses between nodes `nodes` times; with one rank a node (HSDP's replicate group) every hop does
    crossing = 0 if nodes == 1 else min(total_hops, passes * nodes)
    latency = (total_hops - crossing) * intra.latency_us + crossing * inter.latency_us
    return latency * 1e-6 + bus_factor(op, n) * size_bytes / (bandwidth * GB) + added


def node_share(inter: Link, group_ranks: int, node_devices: int) -> Link:
    """The inter-node link of a group with `group_ranks` of a node's `node_devices` devices. A preset's `inter` is
    the node's: one NIC a device (a rail each), NCCL's rings crossing through all of them at once. Groups that each
    hold fewer of a node's ranks and cross nodes together (FSDP x TP's data-parallel groups and HSDP's replicas: one
    rank a node each) split it: each crosses through its share, as many NICs as it has ranks there, the other
    groups using the rest at the same time; over one port a node (an Ethernet-joined cluster) they split the port
    the same way."""
    share = min(1.0, group_ranks / node_devices) if node_devices > 0 else 1.0
    return Link(inter.latency_us, inter.bandwidth_gbps * share)


@dataclass(frozen=True)
class Fit:
    link: Link
    r_squared: float
    points: int


def fit_link(samples: Sequence[tuple[str, int, float]], n: int) -> Fit:
    """Non-negative least squares of seconds against hops and bus bytes, pooled over ops:
    t = hops x alpha + bus_factor x S / B. `samples`: (op, size in bytes, median seconds) from the collectives
    benchmark over `n` ranks. R^2 is of the fitted times against the measured ones."""
    design = np.array([[hops(op, n), bus_factor(op, n) * size] for op, size, _ in samples], dtype=float)
    seconds = np.array([s for _, _, s in samples], dtype=float)
    scale = design.max(axis=0)
    scale[scale == 0] = 1.0
    from scipy import optimize  # here: every run.py imports this module, and only a link measurement fits

    (alpha, inverse_bw), _ = optimize.nnls(design / scale, seconds)
    alpha, inverse_bw = alpha / scale[0], inverse_bw / scale[1]
    fitted = design @ np.array([alpha, inverse_bw])
    residual = float(((seconds - fitted) ** 2).sum())
    total = float(((seconds - seconds.mean()) ** 2).sum()) or 1.0
    bandwidth = 1 / inverse_bw / GB if inverse_bw > 0 else float("inf")
    return Fit(Link(latency_us=float(alpha * 1e6), bandwidth_gbps=float(bandwidth)), 1 - residual / total, len(samples))


def fit_links(samples: Sequence[tuple[str, int, float]], n: int) -> tuple[Fit, dict[str, Fit]]:
    """The pooled fit, and one per op (each op's own latency and bandwidth)."""
    ops = dict.fromkeys(op for op, _, _ in samples)
    return fit_link(samples, n), {op: fit_link([s for s in samples if s[0] == op], n) for op in ops}
