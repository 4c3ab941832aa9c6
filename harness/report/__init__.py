"""The side-by-side report: every results.json under the given folders, one row per combination.

    python -m harness.report runs/multirun/2026-11-21_10-00-00 [more folders] [--baseline ddp:O0] [--out DIR]

Writes report.md, report.csv, report.json, PNG plots and index.html, and logs the terminal's table.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from harness.core.results import write_json_atomic
from harness.report.command import main
from harness.report.decision import Decision, decide
from harness.report.findings import Report, compute, of_rows
from harness.report.page import to_html
from harness.report.plots import write_plots
from harness.report.rows import PER, Row, build_rows, find_results, percentile
from harness.report.tables import table_rows, terminal_table, to_markdown, write_csv

__all__ = ["PER", "Decision", "Report", "main", "Row", "build_report", "build_rows", "compute", "decide",
           "find_results", "of_rows", "percentile", "table_rows", "terminal_table", "to_html", "to_markdown",
           "write_csv", "write_plots"]
log = logging.getLogger(__name__)


def build_report(paths: Sequence[Path], out_dir: Path, baseline: str | None = None, quiet: bool = False,
                 project: Sequence[str] = ()) -> Report:
    """The Report computed once (harness.report.findings), then each output formats it."""
    report = compute(paths, baseline, project)
    for entry in report.skipped_files:
        log.warning("skipping unreadable results file %s", entry)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = write_plots(report.rows, out_dir, report.baseline)
    scaling = None
    if report.projected:
        from harness.report import projection

        scaling = projection.scaling_plot(report.rows, report.projected, out_dir / "scaling.png")
    (out_dir / "report.md").write_text(to_markdown(report))
    write_csv(report.rows, out_dir / "report.csv")
    write_json_atomic(out_dir / "report.json", report.as_json())
    (out_dir / "index.html").write_text(to_html(report, pngs, scaling))
    report.outputs = [out_dir / n for n in ("report.md", "report.csv", "report.json", "index.html")] + pngs \
        + ([scaling] if scaling else [])
    if not quiet:
        log.info("%s", terminal_table(report))
        log.info("report: %s", out_dir / "index.html")
    return report


