"""results.json's `gpu_activity` and `energy_j_per_image`: what NVML said the GPUs did during the steady windows.

The sampler reads every `memory.interval_ms` in the launcher; each rank's clock notes its windows' Unix times.
Utilisation, SM clock and power are the means of the readings taken inside steady windows; energy is the
energy counter's rise across each steady window (read between the readings on either side, linearly), summed
over the run's GPUs and divided by the images those windows trained. A figure the GPU or driver does not
give is None, with NVML's reason, never 0."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from typing import Any

from harness.core.timing import Window

Readings = list[tuple[float, dict[str, dict[str, float | None]]]]
AVERAGED = ("utilization_pct", "sm_clock_mhz", "power_w")


def steady_spans(windows: Sequence[Window], spans: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    """The Unix (start, end) of the run's steady windows, from one rank's clock."""
    return [(float(s[0]), float(s[1])) for w, s in zip(windows, spans, strict=False) if not w.warmup and not w.profiled]


def counter_at(series: list[tuple[float, float]], t: float) -> float | None:
    """The energy counter at time t, linearly between the readings either side; None outside them."""
    times = [at for at, _ in series]
    i = bisect.bisect_left(times, t)
    if i < len(times) and times[i] == t:
        return series[i][1]
    if i == 0 or i == len(times):
        return None
    (t0, e0), (t1, e1) = series[i - 1], series[i]
    return e0 + (e1 - e0) * (t - t0) / (t1 - t0)


def activity_section(readings: Readings, spans: Sequence[tuple[float, float]], images: int,
                     unsupported: dict[str, str]) -> tuple[dict[str, Any], float | None]:
    """(`gpu_activity`, `energy_j_per_image`) over the steady `spans`, which trained `images` images."""
    devices = list(dict.fromkeys(label for _, per_device in readings for label in per_device))
    inside = [(at, per) for at, per in readings if any(a <= at <= b for a, b in spans)]
    rows = []
    for device in devices:
        row: dict[str, Any] = {"device": device}
        for key in AVERAGED:
            values = [per[device][key] for _, per in inside if per.get(device, {}).get(key) is not None]
            row[key] = round(statistics.fmean(values), 1) if values else None
        energy = [(at, per[device]["energy_j"]) for at, per in readings
                  if per.get(device, {}).get("energy_j") is not None]
        rises = [(counter_at(energy, b), counter_at(energy, a)) for a, b in spans]
        known = spans and all(end is not None and start is not None for end, start in rises)
        row["energy_j"] = round(sum(end - start for end, start in rises), 3) if known else None  # type: ignore[operator]
        rows.append(row)
    reasons = {key: reason for key, reason in unsupported.items()}
    if spans and not inside:
        reasons["readings"] = "no reading fell inside a steady window (windows shorter than memory.interval_ms)"
    energies = [r["energy_j"] for r in rows]
    per_image = sum(energies) / images if rows and images and all(e is not None for e in energies) else None
    return {"per_device": rows, "readings": len(inside), "unavailable": reasons}, per_image
