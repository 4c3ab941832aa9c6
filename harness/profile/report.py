"""The report's breakdown (profile=true), the profile feature's side: the profiled window's parts, the slowest
rank's, pooled over a row's repeats from the runs' records alone (this package never imports the report)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.core.results import RunRecord


@dataclass(frozen=True)
class ProfileSection:
    """Where a row's profiled window went: each part's share of it and how much communication overlapped other
    work, each the median over the repeats."""

    breakdown: Mapping[str, float]  # part (compute, communication, data_wait, optimizer, other) -> share
    comm_overlapped_share: float | None = None  # of all the time a collective was in flight
    view: str | None = None  # host or device


def section(ok: Sequence[RunRecord]) -> ProfileSection | None:
    """None: no run of the row was profiled."""
    runs = [r.profile.run for r in ok if r.profile and r.profile.run]
    if not runs:
        return None
    overlapped = [run["communication_overlapped_s"] / run["communication_total_s"] for run in runs
                  if run["communication_total_s"] > 0]
    return ProfileSection(
        breakdown={part: statistics.median(run["shares"][part] for run in runs) for part in runs[0]["shares"]},
        comm_overlapped_share=statistics.median(overlapped) if overlapped else None, view=runs[0]["view"])
