"""The report's prediction section, the plan feature's side: each row's predictions beside what its runs
measured, pooled over the repeats (medians)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from harness.core.results import RunRecord

if TYPE_CHECKING:
    from harness.report.rows import Row


def _median_of(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def pool(row: Row, ok: Sequence[RunRecord]) -> None:
    pairs = [(r.prediction, r.prediction_error) for r in ok if r.prediction and r.prediction_error]
    if not pairs:
        return
    row.predicted_peak_mib = _median_of([p.peak_mib for p, _ in pairs])
    band = pairs[0][0].peak_mib_band
    if row.predicted_peak_mib is not None and len(band) == 2 and all(b is not None for b in band):
        scale = row.predicted_peak_mib / pairs[0][0].peak_mib if pairs[0][0].peak_mib else 1.0
        row.predicted_peak_band = (band[0] * scale, band[1] * scale)
    row.measured_peak_mib = _median_of([e.measured_peak_mib for _, e in pairs])
    row.peak_error = _median_of([e.peak_mib for _, e in pairs])
    row.predicted_s_per_it = _median_of([p.s_per_iteration for p, _ in pairs])
