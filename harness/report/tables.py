"""The report as tables: report.md and index.html's table (formatted cells), report.csv (plain numbers),
and the terminal's short form."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from harness.parity import report as parity
from harness.report import columns
from harness.report.columns import BREAKDOWN_HEAD
from harness.report.decision import WIN_WORDS
from harness.report.findings import Report
from harness.report.rows import PER, Row


def table_rows(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """The pretty table (report.md, index.html): formatted cells, units in the cells."""
    shown, body = columns.table(rows)
    return [c.header or "" for c in shown], body


TEXT_CSV = ("combination", "strategy", "amp", "model", "variant", "devices", "parity", "parity_reference", "status",
            "reason")  # report.csv's columns of words; every other one holds a number ("nan" for none)


def write_csv(rows: Sequence[Row], path: Path) -> None:
    """One plain number per cell ("nan" where there is none), units in the header, for tools."""
    header, body = columns.csv_table(rows)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for values in body:
            writer.writerow(["nan" if v is None else repr(float(v)) if isinstance(v, float) else v for v in values])


SECTION_NOTES = {
    "speed": lambda baseline: (
        f"Speedup against {baseline or 'none (no row ran)'}, paired by round. Throughput is the geometric mean of a "
        f"row's runs (steady-state windows, warm-up excluded), time per {PER} iterations each run's median window "
        "pooled the same way, each with its 95 % interval from the runs (fresh processes in interleaved rounds; "
        "docs/verdict.md); the p10–p90 of the windows within runs is in report.csv. Efficiency is the speedup of a "
        "multi-device row over the one-device row at the same amp level, divided by its devices."),
    "cumulative": lambda baseline: "The time at each iteration count (median over runs), as in the original "
                                   "hand-made table; report.csv has every edge.",
    "memory": lambda baseline: (
        "Mem max/min: what the device held, peak minus the pre-run baseline (GPU: NVML's memory in use; CPU: each "
        "worker process's resident memory, the runtime's own included; median over runs, min–max in brackets). "
        "Whether it fits is answered by the pair beside it: the peak predicted before the run, with its 90 % band, "
        "and the measured peak of the same kind (GPU: the caching allocator's reserved peak; CPU: the peak of live "
        "tensor bytes), the largest rank's. On CPU each worker is a process, not a device: imbalance has no meaning "
        "there (n/a)."),
    "time": lambda baseline: (
        "Compile s: torch.compile's time (compile=true), before the clock and outside start-up, or XLA's graph "
        "compiles (in warm-up). Data wait: the share of the steady windows the loop waited for its next batch. With "
        f"profile=true, the profiled window's time split into {BREAKDOWN_HEAD} (the slowest rank's), and the share "
        "of communication that overlapped other work."),
}
BUSY_NOTE = (  # under the prediction table, where a busy row's time error is not judged
    "A row whose every run was timed while the machine was busy shows its time error as `— (busy)`: "
    "the others' work is in its time, so it says nothing of the prediction (memory is unaffected).")


def to_markdown(report: Report) -> str:
    """The page's order in Markdown: the verdict, a table per question, what did not run."""
    rows, baseline, decision, skipped = report.rows, report.baseline, report.decision, report.skipped_files
    lines = ["# Strategies side by side", ""]
    if report.search is not None:  # a search's answer comes before everything it was decided from
        lines += report.search.markdown()
    lines += [f"**Verdict:** {decision.verdict}", ""]
    for section, heading in columns.SECTIONS:
        shown, body = columns.section_table(rows, section)
        if not shown:
            continue
        header = [c.header or "" for c in shown]
        lines += [f"## {heading}", ""]
        note = SECTION_NOTES.get(section)
        if note:
            lines += [note(baseline), ""]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in body]
        lines.append("")
        if section == "speed":
            won = decision.winners
            lines += ["Clear wins (by the rule, docs/verdict.md): " +
                      (", ".join(f"{WIN_WORDS[k]}: {v}" for k, v in won.items()) or "none"), "",
                      f"How reproducible: {decision.reproducibility}.", ""]
        if section == "parity":
            lines += [f"- {s}" for s in parity.notes(rows)] + [""]
        if section == "prediction" and any(r.busy and columns.prediction(r).time_error is not None
                                           for r in columns.ran(rows)):
            lines += [BUSY_NOTE, ""]
    missing = columns.not_run(rows)
    if missing:
        lines += ["## What did not run here", "", *[f"- {status}: {reason} — {', '.join(labels)}"
                                                    for status, reason, labels in missing], ""]
    if skipped:
        lines += ["Unreadable results files (skipped):", *[f"- {s}" for s in skipped]]
    text = "\n".join(lines).rstrip() + "\n"
    if report.projected:
        from harness.report import projection

        text += "\n" + projection.markdown(report.projected)
    return text


def terminal_table(report: Report, width: int | None = None) -> str:
    """The terminal's short form, in the page's order and within 80 columns: the verdict, then a table per
    question (speed, memory) with the figures a reader compares first, what did not run (one line per
    reason), how reproducible the figures are. Everything else is in report.md and index.html."""
    from rich.table import Table

    from harness.launch.console import render

    rows, baseline, decision = report.rows, report.baseline, report.decision
    won = decision.winners
    parts = [f"Verdict: {decision.verdict}"]
    if report.search is not None:  # the search's answer first, then what it was decided from
        found = report.search
        parts = [f"Search: {found.sentence}", *([f"Train with it: {found.command}"] if found.command else []),
                 f"Search cost: {found.cost}",
                 *([f"Pruned by prediction: {len(found.pruned)} (report.md lists each with its reason)"]
                   if found.pruned else []), *parts]
    titles = {"speed": f"Speed (speedup against {baseline})" if baseline else "Speed", "memory": "Memory"}
    for section, title in titles.items():
        shown = [c for c in columns.columns(rows) if c.terminal is not None and c.terminal_cell is not None
                 and c.section in ("all", section) and c.shown(rows)]
        ran = columns.ran(rows)
        if len(shown) < 2 or not ran:
            continue
        caption = "★ fastest by the rule; ±: 95 % interval from the runs; ? spread unknown" \
            if section == "speed" else None
        table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
        for column in shown:
            table.add_column(column.terminal, justify="right" if column.numeric else "left", overflow="fold")
        for row in ran:
            table.add_row(*[("★" if column.star and won.get(column.star) == row.label else "")
                            + column.terminal_cell(row) for column in shown if column.terminal_cell is not None])
        parts.append(render(table, width=width))
    missing = columns.not_run(rows)
    if missing:
        import textwrap

        parts.append("Did not run here:")
        parts += [textwrap.fill(f"{status}: {reason}: {', '.join(labels)}", width=width or 80,
                                initial_indent="  ", subsequent_indent="    ") for status, reason, labels in missing]
    parts.append(f"How reproducible: {decision.reproducibility}")
    said = parity.notes(rows)
    if said:
        parts += ["Numerical parity:", *said]
    if report.projected:
        from harness.report import projection

        parts.append(projection.terminal(report.projected))
    return "\n".join(parts)
