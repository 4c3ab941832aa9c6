"""Where the time goes, in one place: a rank's profiler windows (rank.py), the per-phase breakdown
(breakdown.py) and the parent's merge into results.json (merge.py)."""
