"""The side-by-side report: every results.json under the given folders, one row per combination.

    python -m harness.report runs/multirun/2026-11-21_10-00-00 [more folders] [--baseline ddp:O0] [--out DIR]

Writes report.md, report.csv, report.json, PNG plots and index.html, and logs the terminal's table.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.core.results import write_json_atomic
from harness.report.command import main
from harness.report.decision import Decision, decide
from harness.report.page import to_html
from harness.report.plots import write_plots
from harness.report.rows import PER, Row, build_rows, context, find_results, percentile
from harness.report.tables import table_rows, terminal_table, to_markdown, write_csv
from harness.verdict.sweep_plan import read_plan

__all__ = ["PER", "Decision", "Report", "main", "Row", "build_report", "build_rows", "decide", "find_results",
           "percentile", "table_rows", "terminal_table", "to_html", "to_markdown", "write_csv", "write_plots"]
log = logging.getLogger(__name__)


@dataclass
class Report:
    rows: list[Row]
    baseline: str | None
    skipped_files: list[str]
    decision: Decision
    outputs: list[Path] = field(default_factory=list)


def build_report(paths: Sequence[Path], out_dir: Path, baseline: str | None = None, quiet: bool = False,
                 project: Sequence[str] = ()) -> Report:
    """`project`: hardware presets to project every finished row onto (harness.report.projection)."""
    found, skipped = find_results(paths)
    for entry in skipped:
        log.warning("skipping unreadable results file %s", entry)
    plan = read_plan(list(paths))
    rows, base = build_rows(found, baseline, planned=plan.planned if plan else None)
    ctx = context(found)
    decision = decide(rows, plan, ctx.commands[0] if len(ctx.commands) == 1 else None,
                      [record.overrides for _, record in found])
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(rows=rows, baseline=base, skipped_files=skipped, decision=decision)
    projected, extra, markdown, scaling = [], "", to_markdown(rows, base, skipped, decision), []
    pngs = write_plots(rows, out_dir, base)
    if project:
        from harness.report import projection
        from harness.report.page import embedded

        projected = projection.project(rows, project)
        plot = projection.scaling_plot(rows, projected, out_dir / "scaling.png")
        scaling = [plot] if plot else []
        extra = projection.html_section(projected, embedded(plot) if plot else "")
        markdown += "\n" + projection.markdown(projected)
    (out_dir / "report.md").write_text(markdown)
    write_csv(rows, out_dir / "report.csv")
    write_json_atomic(out_dir / "report.json", {"baseline": base, "skipped_files": skipped, "winners": decision.winners,
                                                  "verdict": decision.verdict, "how_reproducible": decision.reproducibility,
                                                  "rows": [asdict(r) for r in rows], "projected": projected})
    (out_dir / "index.html").write_text(to_html(rows, base, pngs, skipped, decision, ctx, extra))
    report.outputs = [out_dir / n for n in ("report.md", "report.csv", "report.json", "index.html")] + pngs + scaling
    if not quiet:
        log.info("%s", terminal_table(rows, base, decision))
        if projected:
            from harness.report import projection

            log.info("%s", projection.terminal(projected))
        log.info("report: %s", out_dir / "index.html")
    return report


