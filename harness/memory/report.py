"""The report's memory section, the memory feature's side: each row's memory over its repeats."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from harness.core.results import RunRecord
from harness.memory import imbalance

if TYPE_CHECKING:
    from harness.report.rows import Row


def pool(row: Row, ok: Sequence[RunRecord]) -> None:
    """Memory of every repeat: the parameters the largest rank holds (a shard under FSDP2); per device the median
    of the repeats' use, the row's figures the median of
    the repeats' largest (and smallest) device, with min-max over repeats as the spread."""
    per_run = [[e.params_held_mib for e in r.ranks if e.params_held_mib is not None] for r in ok]
    largest = [max(ranks) for ranks in per_run if ranks]
    row.params_rank_mib = statistics.median(largest) if largest else None
    balances = [imbalance.analyze(r) for r in ok]
    runs = [b for b in balances if b.devices]
    row.sources = sorted({r.memory.source or "none" for r in ok})
    row.memory_source = row.sources[0] if len(row.sources) == 1 else "+".join(row.sources)
    if not runs:
        return
    per_device: dict[str, list[float]] = {}
    pids: dict[str, set[int]] = {}
    for balance in runs:
        for d in balance.devices:
            per_device.setdefault(d["device"], []).append(d["used_mib"])
            pids.setdefault(d["device"], set()).update(d["pids"])
    row.memory_per_device = [{"device": device, "used_mib": statistics.median(used), "pids": sorted(pids[device])}
                             for device, used in per_device.items()]
    maxima = [max(d["used_mib"] for d in b.devices) for b in runs]
    row.mem_max_mib = statistics.median(maxima)
    row.mem_min_mib = statistics.median(min(d["used_mib"] for d in b.devices) for b in runs)
    if len(maxima) >= 2:
        row.mem_max_lo, row.mem_max_hi = min(maxima), max(maxima)
    excess = [b.base_excess_pct for b in runs if b.base_excess_pct is not None]
    row.mem_imbalance_pct = statistics.median(excess) if excess else None
