"""The report's prediction section, the plan feature's side: a row's predictions beside what its runs measured,
pooled over the repeats (medians) from the runs' records alone (this package never imports the report)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from harness.core.results import RunRecord


@dataclass(frozen=True)
class PredictionSection:
    """The prediction made before each run of a row, beside what the runs measured (medians over repeats)."""

    predicted_peak_mib: float | None = None
    predicted_peak_band: tuple[float, float] | None = None  # where 90 % of the truths fall, by the band's source
    measured_peak_mib: float | None = None
    peak_error: float | None = None  # (measured - predicted) / measured
    predicted_s_per_it: float | None = None
    measured_s_per_it: float | None = None  # the speed table's s per iteration (`beside`): one figure, one question
    time_error: float | None = None  # (measured - predicted) / measured


def _median_of(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def section(ok: Sequence[RunRecord]) -> PredictionSection | None:
    """None: no run of the row was predicted (or none measured what its prediction is checked against)."""
    pairs = [(r.prediction, r.prediction_error) for r in ok if r.prediction and r.prediction_error]
    if not pairs:
        return None
    peak = _median_of([p.peak_mib for p, _ in pairs])
    band, first = pairs[0][0].peak_mib_band, pairs[0][0].peak_mib
    scaled = None
    if peak is not None and len(band) == 2 and band[0] is not None and band[1] is not None:
        scale = peak / first if first else 1.0
        scaled = (band[0] * scale, band[1] * scale)
    return PredictionSection(predicted_peak_mib=peak, predicted_peak_band=scaled,
                             measured_peak_mib=_median_of([e.measured_peak_mib for _, e in pairs]),
                             peak_error=_median_of([e.peak_mib for _, e in pairs]),
                             predicted_s_per_it=_median_of([p.s_per_iteration for p, _ in pairs]))


def beside(found: PredictionSection, s_per_it: float | None) -> PredictionSection:
    """The section with the measured time the speed table shows (its level, per iteration) and its error, not a
    second figure for the same question (each run's mean over its steady windows, in results.json)."""
    if found.predicted_s_per_it is None or s_per_it is None:
        return found
    return replace(found, measured_s_per_it=s_per_it, time_error=(s_per_it - found.predicted_s_per_it) / s_per_it)
