"""A report's files: the Report computed once (harness.report.findings), then each output formats it, written
into one folder (report.md, report.csv, report.json, the plots, index.html) and the terminal's table logged."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from harness.core.results import write_json_atomic
from harness.report.findings import Report, compute
from harness.report.page import to_html
from harness.report.plots import write_plots
from harness.report.tables import terminal_table, to_markdown, write_csv

log = logging.getLogger("harness.report")


def build_report(paths: Sequence[Path], out_dir: Path, baseline: str | None = None, quiet: bool = False,
                 project: Sequence[str] = (), strict: bool = False) -> Report:
    """The Report computed once, then each output formats it. `strict`: a baseline no row can be is a
    ConfigError, raised before anything is written (the report command's --baseline)."""
    report = compute(paths, baseline, project, strict)
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
