"""What a report says, computed once from the records: the rows, the baseline, the verdict and winners
(harness.report.decision), the context a reader trusts the figures by, and the projections asked for. The
outputs (report.md, report.csv, report.json, index.html, the terminal) only format a `Report`; none of them
decides anything again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.report.decision import Decision, decide, figure
from harness.report.rows import Context, Row, context, find_results, row_set
from harness.search.answer import SearchAnswer, answer
from harness.search.record import read_search
from harness.verdict.intervals import Fit
from harness.verdict.sweep_record import SweepRecord, read_sweep_record


@dataclass
class Report:
    rows: list[Row]
    baseline: str | None
    decision: Decision
    context: Context | None = None
    skipped_files: list[str] = field(default_factory=list)
    projected: list[dict[str, Any]] = field(default_factory=list)  # rows projected onto presets (--project)
    search: SearchAnswer | None = None  # `-m search=true`: its answer, shown first
    outputs: list[Path] = field(default_factory=list)  # the files written from it

    def as_json(self) -> dict[str, Any]:
        """report.json."""
        return {"baseline": self.baseline, "skipped_files": self.skipped_files, "winners": self.decision.winners,
                "verdict": self.decision.verdict, "how_reproducible": self.decision.reproducibility,
                "rows": [r.as_json() for r in self.rows], "projected": self.projected,
                "search": self.search.as_json() if self.search else None}


def compute(paths: Sequence[Path], baseline: str | None = None, project: Sequence[str] = (),
            strict: bool = False) -> Report:
    """Every results.json under `paths` into one Report. `project`: hardware presets to project every finished
    row onto (harness.report.projection); `strict`: a baseline no row can be is a ConfigError (else a warning)."""
    found, skipped = find_results(paths)
    plan = read_sweep_record(list(paths))
    built = row_set(found, baseline, strict, plan.planned if plan else None)  # the fit, built once
    rows, base = built.rows, built.baseline
    mark_stopped(rows, plan)
    ctx = context(found)
    decision = decide(rows, plan, ctx.commands[0] if len(ctx.commands) == 1 else None,
                      [record.overrides for _, record in found], fit=built.fit)
    projected: list[dict[str, Any]] = []
    if project:
        from harness.report import projection

        projected = projection.project(rows, project)
    return Report(rows=rows, baseline=base, decision=decision, context=ctx, skipped_files=skipped, projected=projected,
                  search=search_answer(list(paths), rows, decision))


def mark_stopped(rows: Sequence[Row], plan: SweepRecord | None) -> None:
    """`stopped early after round r` for the rows racing stopped, and only those: the sweep's rounds.json says
    which (a row whose last runs were busy or failed was not stopped). A row is its plan's combination whose
    overrides are among the row's; a report without a plan (merged sweeps) or of repeat=N stops none."""
    for row in rows:
        row.stopped_early = None
        if plan is None or plan.repeat is not None:
            continue
        matching = [(len(combination), name) for combination, name in zip(plan.combinations, plan.names, strict=True)
                    if set(combination) <= set(row.overrides)]
        if matching:
            row.stopped_early = plan.stopped.get(max(matching)[1])


def search_answer(paths: list[Path], rows: list[Row], decision: Decision) -> SearchAnswer | None:
    """A search's folder: its answer, from the verdict's own standing of the rows (harness.search.answer)."""
    record = read_search(paths)
    if record is None or decision.standing is None or decision.margin is None:
        return None
    return answer(record, rows, decision.standing, decision.margin, figure)


def of_rows(rows: list[Row], baseline: str | None, skipped: Sequence[str] = (), fit: Fit | None = None) -> Report:
    """A Report of rows already built (tests, the report's own benchmark): decided here, as compute() does, on
    `fit` where the rows came with theirs (harness.report.rows.row_set)."""
    return Report(rows=rows, baseline=baseline, decision=decide(rows, fit=fit), skipped_files=list(skipped))
