"""Numerical parity in one place: a rank's record (rank.py), the parent's merge into results.json
(merge.py) and the report's verdicts against a reference run (report.py)."""
