"""results.json's `profile` (profile=true): the profiled window's breakdown per rank and for the run, the
traces, and what profiling cost that window."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.core.rank_record import RankRecord
from harness.core.timing import Window, steady_windows


def profile_section(records: Sequence[RankRecord], windows: Sequence[Window], run_dir: Path) -> dict[str, Any]:
    """The run's breakdown is its slowest rank's (the one the others waited for at the window's end)."""
    per_rank = {str(r.rank): r.profile for r in records if r.profile}
    if not per_rank:
        return {"run": None, "per_rank": {}, "traces": [], "slowdown": None,
                "note": "no rank finished its profiled window"}
    slowest = max(per_rank, key=lambda k: per_rank[k]["window_s"])
    traces = [_relative(Path(p["trace"]), run_dir) for p in per_rank.values()]
    profiled = [w for w in windows if w.profiled]
    steady = [w.seconds for w in steady_windows(windows)]
    slowdown = profiled[0].seconds / statistics.median(steady) if profiled and steady else None
    run = {k: v for k, v in per_rank[slowest].items() if k != "trace"}
    return {"run": {"rank": int(slowest), **run},
            "per_rank": {k: {key: v for key, v in p.items() if key != "trace"} for k, p in per_rank.items()},
            "traces": traces, "slowdown": slowdown}


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return str(path.resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return str(path)
