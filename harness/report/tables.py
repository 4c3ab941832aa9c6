"""The report as tables: report.md and index.html's table (formatted cells), report.csv (plain numbers),
and the terminal's short form."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from harness.parity import report as parity
from harness.report.rows import PER, WIN_WORDS, Row, reproducibility, summary, winners


def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "—"
    return f"{round(value, digits) + 0.0:.{digits}f}{suffix}"  # + 0.0: never "-0"


def table_rows(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """The pretty table (report.md, index.html): formatted cells, units in the cells."""
    edges = sorted({it for r in rows for it, _ in r.cumulative})
    header = ["combination", "devices", "procs", "batch", f"s/{PER} it (p10–p90)", *[f"{it} it" for it in edges],
              "img/s", "speedup", "efficiency", "mem max MiB", "mem min MiB", "theory MiB/rank", "imbalance", "final loss",
              "startup s", "compile s", "data wait", f"profiled: {BREAKDOWN_HEAD}", "comm overlapped", "J/image", "status"]
    body = []
    for r in rows:
        cumulative = dict(r.cumulative)
        if r.s_per_20 is None:
            spread = ""
        elif r.spread_known:
            spread = f" ({_fmt(r.s_per_20_p10, 3)}–{_fmt(r.s_per_20_p90, 3)})"
        else:
            spread = " (spread unknown)"
        mem_spread = f" ({_fmt(r.mem_max_lo, 0)}–{_fmt(r.mem_max_hi, 0)})" if r.mem_max_lo is not None else ""
        status = r.status if not r.reason else f"{r.status}: {r.reason}"
        body.append([r.label, ",".join(r.devices) or "—", str(r.processes or "—"), str(r.global_batch or "—"),
                     _fmt(r.s_per_20, 3) + spread, *[_fmt(cumulative.get(it), 1) for it in edges],
                     _fmt(r.throughput, 1), _fmt(r.speedup, 2, "×"), _fmt(r.efficiency and 100 * r.efficiency, 0, "%"),
                     _fmt(r.mem_max_mib, 0) + mem_spread, _fmt(r.mem_min_mib, 0), _fmt(r.theory_mib, 1),
                     _fmt(r.mem_imbalance_pct, 0, "%"), _fmt(r.final_loss, 4), _fmt(r.startup_s, 1),
                     _fmt(r.compile_s, 1), _pct(r.data_wait_share), breakdown_cell(r),
                     _pct(r.comm_overlapped_share), _fmt(r.energy_j_per_image, 3), status])
    if any(r.parity is not None for r in rows):  # numerical parity (parity=true): before the status
        header[-1:-1] = ["parity (max rel Δ)", "max loss Δ"]
        for r, cells in zip(rows, body, strict=True):
            cells[-1:-1] = [parity.cell(r), "—" if r.parity_loss_diff is None else f"{r.parity_loss_diff:.1e}"]
    return header, body


BREAKDOWN_HEAD = "compute/comm/data/optim/other %"


def _pct(share: float | None) -> str:
    return _fmt(100 * share, 0, "%") if share is not None else "—"


def breakdown_cell(row: Row) -> str:
    """'41/35/19/2/3': the profiled window's shares in percent, in BREAKDOWN_HEAD's order."""
    if not row.breakdown:
        return "—"
    return "/".join(f"{100 * row.breakdown[p]:.0f}" for p in ("compute", "communication", "data_wait", "optimizer",
                                                              "other"))


# report.csv: one plain number per cell ("nan" where there is none), units in the header, for tools
CSV_TEXT = ("combination", "strategy", "amp", "model", "devices", "status", "reason", "variant", "parity",
            "parity_reference")
CSV_NUMBERS = (
    ("n_devices", lambda r: r.n_devices), ("processes", lambda r: r.processes),
    ("global_batch", lambda r: r.global_batch), ("runs", lambda r: r.runs), ("ok_runs", lambda r: r.ok_runs),
    ("steady_windows", lambda r: r.steady_windows), ("spread_known", lambda r: int(r.spread_known)),
    ("s_per_20_median", lambda r: r.s_per_20), ("s_per_20_p10", lambda r: r.s_per_20_p10),
    ("s_per_20_p90", lambda r: r.s_per_20_p90), ("img_s", lambda r: r.throughput),
    ("img_s_lo", lambda r: r.throughput_lo), ("img_s_hi", lambda r: r.throughput_hi),
    ("speedup", lambda r: r.speedup), ("efficiency", lambda r: r.efficiency),
    ("mem_max_mib", lambda r: r.mem_max_mib), ("mem_max_lo_mib", lambda r: r.mem_max_lo),
    ("mem_max_hi_mib", lambda r: r.mem_max_hi), ("mem_min_mib", lambda r: r.mem_min_mib),
    ("mem_imbalance_pct", lambda r: r.mem_imbalance_pct), ("final_loss", lambda r: r.final_loss),
    ("startup_s", lambda r: r.startup_s), ("theory_mib", lambda r: r.theory_mib),
    ("compile_s", lambda r: r.compile_s), ("parity_max_abs", lambda r: r.parity_max_abs),
    ("parity_max_rel", lambda r: r.parity_max_rel), ("parity_loss_diff", lambda r: r.parity_loss_diff),
    ("startup_s", lambda r: r.startup_s), ("data_wait_share", lambda r: r.data_wait_share),
    ("profiled_compute_share", lambda r: r.breakdown.get("compute")),
    ("profiled_communication_share", lambda r: r.breakdown.get("communication")),
    ("profiled_data_wait_share", lambda r: r.breakdown.get("data_wait")),
    ("profiled_optimizer_share", lambda r: r.breakdown.get("optimizer")),
    ("profiled_other_share", lambda r: r.breakdown.get("other")),
    ("comm_overlapped_share", lambda r: r.comm_overlapped_share), ("energy_j_per_image", lambda r: r.energy_j_per_image),
)


def write_csv(rows: Sequence[Row], path: Path) -> None:
    edges = sorted({it for r in rows for it, _ in r.cumulative})
    header = [*CSV_TEXT, *(name for name, _ in CSV_NUMBERS), *(f"cumulative_s_at_{it}" for it in edges)]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for r in rows:
            text = [r.label, r.strategy, r.amp, r.model, " ".join(r.devices), r.status, r.reason or "", r.variant,
                    r.parity or "", r.parity_reference or ""]
            cumulative = dict(r.cumulative)
            numbers = [get(r) for _, get in CSV_NUMBERS] + [cumulative.get(it) for it in edges]
            writer.writerow(text + ["nan" if v is None else repr(float(v)) if isinstance(v, float) else v
                                    for v in numbers])


def to_markdown(rows: Sequence[Row], baseline: str | None, skipped: Sequence[str]) -> str:
    header, body = table_rows(rows)
    lines = ["# Strategies side by side", "", summary(rows, baseline), "",
             f"Baseline for speedup: {baseline or 'none (no row ran)'}. Times are medians over steady-state windows "
             f"(warm-up excluded), normalised to {PER} iterations; the cumulative columns are the time at each "
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
    table = Table(title=title, title_justify="left", caption="★ best by more than the run-to-run spread; "
                  "? spread unknown", caption_justify="left")
    for name, justify in (("combination", "left"), (f"s/{PER} it", "right"), ("img/s", "right"),
                          ("speedup", "right"), ("mem MiB", "right"), ("status", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    reasons: dict[str, int] = {}
    for row in rows:
        star = {k: "★" if won.get(k) == row.label else "" for k in ("throughput", "s_per_20", "mem_max_mib")}
        unknown = "?" if row.s_per_20 is not None and not row.spread_known else ""
        status = row.status
        if row.reason:
            number = reasons.setdefault(row.reason, len(reasons) + 1)
            status += f" [{number}]"
        table.add_row(row.label, star["s_per_20"] + _fmt(row.s_per_20, 3) + unknown,
                      star["throughput"] + _fmt(row.throughput, 1) + unknown, _fmt(row.speedup, 2, "×"),
                      star["mem_max_mib"] + _fmt(row.mem_max_mib, 0), status)
    notes = []
    for reason, number in reasons.items():
        labels = [r.label for r in rows if r.reason == reason]
        notes.append(f"[{number}] {', '.join(labels)}: {reason}")
    said = parity.notes(rows)
    return "\n".join([render(table, width=width), *notes, f"How reproducible: {reproducibility(rows)}",
                      *(["Numerical parity:", *said] if said else []), summary(rows, baseline)])
