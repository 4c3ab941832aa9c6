"""Every column of the report, defined once: report.md and index.html show `header` with `cell`, report.csv
the plain values of `csv`, the terminal's short form the columns that have a `terminal` header. A column
added here appears in every output that shows its kind; none is listed twice anywhere else."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.parity import report as parity
from harness.report.rows import PER, Row

BREAKDOWN_HEAD = "compute/comm/data/optim/other %"
BREAKDOWN_PARTS = ("compute", "communication", "data_wait", "optimizer", "other")


def fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "—"
    return f"{round(value, digits) + 0.0:.{digits}f}{suffix}"  # + 0.0: never "-0"


def pct(share: float | None) -> str:
    return fmt(100 * share, 0, "%") if share is not None else "—"


def breakdown_cell(row: Row) -> str:
    """'41/35/19/2/3': the profiled window's shares in percent, in BREAKDOWN_HEAD's order."""
    if not row.breakdown:
        return "—"
    return "/".join(f"{100 * row.breakdown[p]:.0f}" for p in BREAKDOWN_PARTS)


def _always(rows: Sequence[Row]) -> bool:
    return True


def _with_parity(rows: Sequence[Row]) -> bool:
    return any(r.parity is not None for r in rows)


@dataclass(frozen=True)
class Column:
    """One column. `header`/`cell`: the formatted table (report.md, index.html; None: report.csv only).
    `csv`: report.csv's columns from it, (name, value) with plain numbers or text. `terminal`/`terminal_cell`:
    the terminal's short form (None: not there). `star`: the `winners()` figure that earns it a ★. `numeric`:
    index.html sorts it by the number its cells start with. `shown`: whether the sweep's rows need it at all."""

    header: str | None
    cell: Callable[[Row], str] | None = None
    csv: tuple[tuple[str, Callable[[Row], Any]], ...] = ()
    terminal: str | None = None
    terminal_cell: Callable[[Row], str] | None = None
    star: str | None = None
    numeric: bool = True
    shown: Callable[[Sequence[Row]], bool] = field(default=_always)


def _between(lo: float | None, hi: float | None, digits: int, suffix: str = "") -> str:
    return f" [{fmt(lo, digits)}–{fmt(hi, digits)}{suffix}]" if lo is not None and hi is not None else ""


def _interval_or_unknown(r: Row, lo: float | None, hi: float | None, digits: int) -> str:
    """The 95 % interval from the runs; why there is none; `busy` when every run was taken on a busy machine."""
    if r.throughput is None:
        return ""
    cell = _between(lo, hi, digits) if r.spread_known else " (spread unknown)"
    return cell + (" busy" if r.busy else "")


def _plus_minus(r: Row) -> str:
    """The terminal's short interval: ± half its width, in % of the figure."""
    if r.throughput is None:
        return ""
    if not r.spread_known or r.throughput_lo is None or r.throughput_hi is None:
        return "?"
    return f" ±{50 * (r.throughput_hi - r.throughput_lo) / r.throughput:.0f}%" + (" busy" if r.busy else "")


def _speedup(r: Row, digits: int = 2) -> str:
    if r.speedup is None:
        return "—"
    word = f" {r.speedup_word}" if r.speedup_word in ("faster", "slower") else ""
    return fmt(r.speedup, digits, "×") + _between(r.speedup_lo, r.speedup_hi, digits) + word


def _status(r: Row) -> str:
    status = r.status if not r.reason else f"{r.status}: {r.reason}"
    return status + (f" · stopped early after round {r.stopped_early}: clearly slower" if r.stopped_early else "")


def _cumulative(rows: Sequence[Row]) -> list[Column]:
    """One column per window edge any row reached: the time at that iteration count, as in the original
    hand-made table."""
    edges = sorted({it for r in rows for it, _ in r.cumulative})
    return [Column(f"{it} it", lambda r, it=it: fmt(dict(r.cumulative).get(it), 1),
                   csv=((f"cumulative_s_at_{it}", lambda r, it=it: dict(r.cumulative).get(it)),)) for it in edges]


def columns(rows: Sequence[Row]) -> list[Column]:
    """Every column of the report for these rows, in order (`shown` says which the formatted table leaves out)."""
    return [
        Column("combination", lambda r: r.label, csv=(("combination", lambda r: r.label),), terminal="combination",
               terminal_cell=lambda r: r.label, numeric=False),
        Column(None, csv=(("strategy", lambda r: r.strategy), ("amp", lambda r: r.amp), ("model", lambda r: r.model),
                          ("variant", lambda r: r.variant))),
        Column("devices", lambda r: ",".join(r.devices) or "—",
               csv=(("devices", lambda r: " ".join(r.devices)), ("n_devices", lambda r: r.n_devices))),
        Column("procs", lambda r: str(r.processes or "—"), csv=(("processes", lambda r: r.processes),)),
        Column("batch", lambda r: str(r.global_batch or "—"), csv=(("global_batch", lambda r: r.global_batch),)),
        Column(None, csv=(("runs", lambda r: r.runs), ("ok_runs", lambda r: r.ok_runs),
                          ("steady_windows", lambda r: r.steady_windows),
                          ("spread_known", lambda r: int(r.spread_known)))),
        Column(None, csv=(("rounds", lambda r: len(r.rounds)), ("stopped_early_after_round", lambda r: r.stopped_early),
                          ("busy", lambda r: int(bool(r.busy))))),
        Column(f"s/{PER} it [95 %]", lambda r: fmt(r.s_per_20, 3) + _interval_or_unknown(r, r.s_per_20_lo,
                                                                                       r.s_per_20_hi, 3),
               csv=(("s_per_20", lambda r: r.s_per_20), ("s_per_20_lo", lambda r: r.s_per_20_lo),
                    ("s_per_20_hi", lambda r: r.s_per_20_hi), ("s_per_20_window_p10", lambda r: r.s_per_20_p10),
                    ("s_per_20_window_p90", lambda r: r.s_per_20_p90)),
               terminal=f"s/{PER} it", terminal_cell=lambda r: fmt(r.s_per_20, 3), star="s_per_20"),
        *_cumulative(rows),
        Column("img/s [95 %]", lambda r: fmt(r.throughput, 1) + _interval_or_unknown(r, r.throughput_lo,
                                                                                     r.throughput_hi, 1),
               csv=(("img_s", lambda r: r.throughput), ("img_s_lo", lambda r: r.throughput_lo),
                    ("img_s_hi", lambda r: r.throughput_hi)),
               terminal="img/s", terminal_cell=lambda r: fmt(r.throughput, 1) + _plus_minus(r), star="throughput"),
        Column("speedup [95 %]", _speedup,
               csv=(("speedup", lambda r: r.speedup), ("speedup_lo", lambda r: r.speedup_lo),
                    ("speedup_hi", lambda r: r.speedup_hi)),
               terminal="speedup", terminal_cell=lambda r: fmt(r.speedup, 2, "×")),
        Column("efficiency", lambda r: fmt(r.efficiency and 100 * r.efficiency, 0, "%"),
               csv=(("efficiency", lambda r: r.efficiency),)),
        Column("mem max MiB", lambda r: fmt(r.mem_max_mib, 0) + (f" ({fmt(r.mem_max_lo, 0)}–{fmt(r.mem_max_hi, 0)})"
                                                                 if r.mem_max_lo is not None else ""),
               csv=(("mem_max_mib", lambda r: r.mem_max_mib), ("mem_max_lo_mib", lambda r: r.mem_max_lo),
                    ("mem_max_hi_mib", lambda r: r.mem_max_hi)),
               terminal="mem MiB", terminal_cell=lambda r: fmt(r.mem_max_mib, 0), star="mem_max_mib"),
        Column("mem min MiB", lambda r: fmt(r.mem_min_mib, 0), csv=(("mem_min_mib", lambda r: r.mem_min_mib),)),
        Column("theory MiB/rank", lambda r: fmt(r.theory_mib, 1), csv=(("theory_mib", lambda r: r.theory_mib),)),
        Column("imbalance", lambda r: fmt(r.mem_imbalance_pct, 0, "%"),
               csv=(("mem_imbalance_pct", lambda r: r.mem_imbalance_pct),)),
        Column("final loss", lambda r: fmt(r.final_loss, 4), csv=(("final_loss", lambda r: r.final_loss),)),
        Column("startup s", lambda r: fmt(r.startup_s, 1), csv=(("startup_s", lambda r: r.startup_s),)),
        Column("compile s", lambda r: fmt(r.compile_s, 1), csv=(("compile_s", lambda r: r.compile_s),)),
        Column("data wait", lambda r: pct(r.data_wait_share), csv=(("data_wait_share", lambda r: r.data_wait_share),)),
        Column(f"profiled: {BREAKDOWN_HEAD}", breakdown_cell,
               csv=tuple((f"profiled_{part}_share", lambda r, part=part: r.breakdown.get(part))
                         for part in BREAKDOWN_PARTS)),
        Column("comm overlapped", lambda r: pct(r.comm_overlapped_share),
               csv=(("comm_overlapped_share", lambda r: r.comm_overlapped_share),)),
        Column("J/image", lambda r: fmt(r.energy_j_per_image, 3),
               csv=(("energy_j_per_image", lambda r: r.energy_j_per_image),)),
        # numerical parity (parity=true): before the status; report.csv always has its columns
        Column("parity (max rel Δ)", parity.cell, shown=_with_parity,
               csv=(("parity", lambda r: r.parity or ""), ("parity_reference", lambda r: r.parity_reference or ""),
                    ("parity_max_abs", lambda r: r.parity_max_abs), ("parity_max_rel", lambda r: r.parity_max_rel))),
        Column("max loss Δ", lambda r: "—" if r.parity_loss_diff is None else f"{r.parity_loss_diff:.1e}",
               shown=_with_parity, csv=(("parity_loss_diff", lambda r: r.parity_loss_diff),)),
        Column("status", _status, numeric=False,
               csv=(("status", lambda r: r.status), ("reason", lambda r: r.reason or "")),
               terminal="status", terminal_cell=lambda r: r.status + (f" (stopped r{r.stopped_early})"
                                                                        if r.stopped_early else "")),
    ]


def table(rows: Sequence[Row]) -> tuple[list[Column], list[list[str]]]:
    """report.md's and index.html's table: its columns and each row's formatted cells."""
    shown = [c for c in columns(rows) if c.header is not None and c.shown(rows)]
    return shown, [[c.cell(r) if c.cell else "" for c in shown] for r in rows]


def csv_table(rows: Sequence[Row]) -> tuple[list[str], list[list[Any]]]:
    """report.csv: every column's plain values, whether or not the formatted table shows it."""
    pairs = [pair for c in columns(rows) for pair in c.csv]
    return [name for name, _ in pairs], [[get(r) for _, get in pairs] for r in rows]
