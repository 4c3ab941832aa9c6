"""The side-by-side report: every results.json under the given folders, one row per combination.

    python -m harness.report runs/multirun/2026-11-21_10-00-00 [more folders] [--baseline ddp:O0] [--out DIR]

Writes report.md, report.csv, report.json, PNG plots and index.html, and logs the terminal's table.
"""

from __future__ import annotations

from harness.report.command import main
from harness.report.decision import Decision, decide
from harness.report.findings import Report, compute, of_rows
from harness.report.outputs import build_report
from harness.report.page import to_html
from harness.report.plots import write_plots
from harness.report.rows import PER, Row, RowSet, build_rows, find_results, percentile, row_set
from harness.report.tables import table_rows, terminal_table, to_markdown, write_csv

__all__ = ["PER", "Decision", "Report", "main", "Row", "RowSet", "build_report", "build_rows", "compute", "decide",
           "find_results", "of_rows", "percentile", "row_set", "table_rows", "terminal_table", "to_html",
           "to_markdown", "write_csv", "write_plots"]
