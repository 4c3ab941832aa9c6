"""The report's memory section, the memory feature's side: a row's memory over its repeats, built from the runs'
records alone (the report holds it as it is; this package never imports the report)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.core.results import RunRecord
from harness.memory import imbalance


@dataclass(frozen=True)
class DeviceUse:
    """One device's use over the repeats: the median, and every PID that held it (one per run)."""

    device: str
    used_mib: float
    pids: tuple[int, ...]


@dataclass(frozen=True)
class MemorySection:
    """A row's memory, pooled over its finished runs: the largest (and smallest) device, the median of the repeats',
    with their min-max as the spread (None with one repeat: spread unknown)."""

    sources: tuple[str, ...] = ()  # the runs' memory sources (nvml, torch-allocator, psutil, none)
    params_rank_mib: float | None = None  # what the largest rank's parameters hold (a shard under FSDP2)
    theory_mib: float | None = None  # params + grads + optimizer state per rank in theory (harness.memory.footprint)
    per_device: tuple[DeviceUse, ...] = ()
    max_mib: float | None = None  # median over repeats of the run's largest per-device use
    max_lo: float | None = None  # min-max over repeats
    max_hi: float | None = None
    min_mib: float | None = None
    imbalance_pct: float | None = None  # how far the base device holds more than its share (median)

    @property
    def source(self) -> str | None:
        """`nvml`, or `nvml+psutil` where the repeats measured with different sources."""
        return "+".join(self.sources) or None


def _median_of(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def section(ok: Sequence[RunRecord]) -> MemorySection:
    """Memory of every repeat: the parameters the largest rank holds; per device the median of the repeats' use,
    the row's figures the median of the repeats' largest (and smallest) device."""
    per_run = [[e.params_held_mib for e in r.ranks if e.params_held_mib is not None] for r in ok]
    largest = [max(ranks) for ranks in per_run if ranks]
    found = MemorySection(sources=tuple(sorted({r.memory.source or "none" for r in ok})),
                          params_rank_mib=statistics.median(largest) if largest else None,
                          theory_mib=_median_of([r.memory_theory.total_mib for r in ok if r.memory_theory]))
    runs = [b for b in (imbalance.analyze(r) for r in ok) if b.devices]
    if not runs:
        return found
    used: dict[str, list[float]] = {}
    pids: dict[str, set[int]] = {}
    for balance in runs:
        for d in balance.devices:
            used.setdefault(d["device"], []).append(d["used_mib"])
            pids.setdefault(d["device"], set()).update(d["pids"])
    maxima = [max(d["used_mib"] for d in b.devices) for b in runs]
    excess = [b.base_excess_pct for b in runs if b.base_excess_pct is not None]
    spread = (min(maxima), max(maxima)) if len(maxima) >= 2 else (None, None)
    return MemorySection(
        sources=found.sources, params_rank_mib=found.params_rank_mib, theory_mib=found.theory_mib,
        per_device=tuple(DeviceUse(device, statistics.median(values), tuple(sorted(pids[device])))
                         for device, values in used.items()),
        max_mib=statistics.median(maxima), max_lo=spread[0], max_hi=spread[1],
        min_mib=statistics.median(min(d["used_mib"] for d in b.devices) for b in runs),
        imbalance_pct=statistics.median(excess) if excess else None)
