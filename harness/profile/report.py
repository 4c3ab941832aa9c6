"""The report's breakdown (profile=true), the profile feature's side: the profiled window's parts, the
slowest rank's, pooled over the repeats."""

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
    """The profiled window's parts and how much communication overlapped, each the median over repeats."""
    runs = [r.profile.run for r in ok if r.profile and r.profile.run]
    if not runs:
        return
    row.breakdown = {part: statistics.median(run["shares"][part] for run in runs) for part in runs[0]["shares"]}
    row.comm_overlapped_share = _median_of([run["communication_overlapped_s"] / run["communication_total_s"]
                                            if run["communication_total_s"] > 0 else None for run in runs])
    row.breakdown_view = runs[0]["view"]
