"""The report as tables: report.md and index.html's table (formatted cells), report.csv (plain numbers),
and the terminal's short form."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from harness.parity import report as parity
from harness.report import columns
from harness.report.columns import BREAKDOWN_HEAD
from harness.report.rows import PER, WIN_WORDS, Row, reproducibility, summary, winners


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


def to_markdown(rows: Sequence[Row], baseline: str | None, skipped: Sequence[str]) -> str:
    header, body = table_rows(rows)
    lines = ["# Strategies side by side", "", f"**Verdict:** {summary(rows, baseline)}", "",
             f"Baseline for speedup: {baseline or 'none (no row ran)'}. Throughput is the geometric mean of a row's "
             f"runs (steady-state windows, warm-up excluded), time per {PER} iterations the same figure as time, each "
             "with its 95 % interval from the runs (fresh processes in interleaved rounds; docs/verdict.md); "
             "speedups pair runs of the same round; the p10–p90 of the windows within runs is in report.csv. The "
             "cumulative columns are the time at each "
             "iteration count, as in the original hand-made table. Memory is peak minus the pre-run baseline "
             "(median over repeats, min–max in brackets). Efficiency is the speedup of a multi-device row over "
             "the one-device row at the same amp level, divided by its devices. Theory MiB/rank: parameters, "
             "gradients and optimizer state one rank holds in theory (DDP all, ZeRO the state / N, FSDP all three "
             "/ N; activations and buffers not included), beside the measured peak. Compile s: torch.compile's "
             "time (compile=true), before the clock and outside start-up, or XLA's graph compiles (in warm-up). "
             "Data wait: the share of the steady windows the loop waited for its next batch. With profile=true, "
             f"the profiled window's time split into {BREAKDOWN_HEAD} (the slowest rank's), and the share of "
             "communication that overlapped other work.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in body]
    won = winners(rows)
    lines += ["", "Clear wins (larger than the run-to-run spread): " +
              (", ".join(f"{WIN_WORDS[k]}: {v}" for k, v in won.items()) or "none"),
              "", f"How reproducible: {reproducibility(rows)}."]
    said = parity.notes(rows)
    if said:
        lines += ["", "Numerical parity (parity=true; docs/parity.md):", *[f"- {s}" for s in said]]
    if skipped:
        lines += ["", "Unreadable results files (skipped):", *[f"- {s}" for s in skipped]]
    return "\n".join(lines) + "\n"


def terminal_table(rows: Sequence[Row], baseline: str | None, width: int | None = None) -> str:
    """The terminal's short form, readable at 80 columns: the figures a reader compares first (everything
    else is in report.md). Reasons are grouped into footnotes, one per distinct reason."""
    from rich.table import Table

    from harness.launch.console import render

    won = winners(rows)
    title = f"Strategies side by side (speedup against {baseline})" if baseline else "Strategies side by side"
    table = Table(title=title, title_justify="left", caption="★ best beyond the noise of identical runs; "
                  "±: 95 % interval from the runs; ? spread unknown", caption_justify="left")
    shown = [c for c in columns.columns(rows) if c.terminal is not None and c.terminal_cell is not None]
    for column in shown:
        table.add_column(column.terminal, justify="right" if column.numeric else "left", overflow="fold")
    reasons: dict[str, int] = {}
    for row in rows:
        cells = [("★" if column.star and won.get(column.star) == row.label else "") + column.terminal_cell(row)
                 for column in shown if column.terminal_cell is not None]
        if row.reason:  # the reason once, as a footnote to the status
            number = reasons.setdefault(row.reason, len(reasons) + 1)
            cells[[c.header for c in shown].index("status")] += f" [{number}]"
        table.add_row(*cells)
    notes = []
    for reason, number in reasons.items():
        labels = [r.label for r in rows if r.reason == reason]
        notes.append(f"[{number}] {', '.join(labels)}: {reason}")
    said = parity.notes(rows)
    return "\n".join([f"Verdict: {summary(rows, baseline)}", render(table, width=width), *notes,
                      f"How reproducible: {reproducibility(rows)}", *(["Numerical parity:", *said] if said else [])])
