"""The side-by-side report: every results.json under the given folders, one row per combination.

    python -m harness.report runs/multirun/2026-11-21_10-00-00 [more folders] [--baseline ddp:O0] [--out DIR]

Writes report.md, report.csv, report.json, PNG plots and index.html, and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import html
import logging
import re
import statistics
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.output import imbalance
from harness.output.logs import setup_cli
from harness.output.results import RESULTS_NAME, load_results, write_json_atomic

log = logging.getLogger(__name__)
PER = 20  # the user's unit: seconds per 20 iterations
PLOT_ROWS = 20  # combinations drawn per plot


@dataclass
class Row:
    label: str
    strategy: str
    amp: str
    model: str
    devices: list[str]
    processes: int | None  # distinct rank PIDs of one run (median over repeats)
    global_batch: int | None
    status: str
    reason: str | None
    runs: int
    ok_runs: int
    s_per_20: float | None = None  # median over steady windows (all repeats pooled)
    s_per_20_p10: float | None = None
    s_per_20_p90: float | None = None
    steady_windows: int = 0
    cumulative: list[tuple[int, float]] = field(default_factory=list)  # (iteration, median seconds)
    throughput: float | None = None  # median over repeats
    throughput_lo: float | None = None  # spread: min-max over repeats, else p10-p90 of windows
    throughput_hi: float | None = None
    spread_known: bool = False  # >= 2 repeats or >= 3 steady windows: a spread a win can be judged by
    speedup: float | None = None
    efficiency: float | None = None  # multi-device rows: speedup over the one-device row at this amp / devices
    mem_max_mib: float | None = None  # median over repeats of the run's largest per-device use
    mem_max_lo: float | None = None  # min-max over repeats (None with one repeat: spread unknown)
    mem_max_hi: float | None = None
    mem_min_mib: float | None = None
    mem_imbalance_pct: float | None = None
    memory_per_device: list[dict[str, Any]] = field(default_factory=list)  # device, used_mib (median), pids
    memory_source: str | None = None
    losses: list[tuple[int, float]] = field(default_factory=list)
    final_loss: float | None = None
    startup_s: float | None = None
    sources: list[str] = field(default_factory=list)

    @property
    def n_devices(self) -> int:
        return max(1, len(self.devices))


@dataclass
class Report:
    rows: list[Row]
    baseline: str | None
    skipped_files: list[str]
    outputs: list[Path] = field(default_factory=list)


def find_results(paths: Iterable[Path]) -> tuple[list[tuple[Path, dict[str, Any]]], list[str]]:
    """Every readable results.json under `paths`; unreadable ones are named in a warning and skipped."""
    found, skipped = [], []
    for root in paths:
        files = [root] if root.is_file() else sorted(root.rglob(RESULTS_NAME), key=_natural)
        for path in files:
            try:
                found.append((path, load_results(path)))
            except (OSError, ValueError) as error:
                skipped.append(f"{path}: {error}")
    return found, skipped


def _natural(path: Path) -> list[Any]:
    """Sweep job 2 before job 10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def _key(results: dict[str, Any]) -> tuple[Any, ...]:
    precision = results.get("precision") or {}
    return (results.get("strategy"), results.get("amp"), precision.get("impl"), precision.get("dtype"),
            results.get("model"), tuple(results.get("devices") or ()), results.get("global_batch"),
            results.get("image_size"), results.get("iterations_requested", results.get("iterations")),
            results.get("launcher"))


def _label(group: Sequence[dict[str, Any]], varying: set[int]) -> str:
    key = _key(group[0])
    parts = [f"{key[0]} {key[1]}"]
    names = {2: "impl", 3: "dtype", 4: "model", 5: "devices", 6: "batch", 7: "px", 8: "it", 9: "launcher"}
    for index in sorted(varying):
        value = ",".join(key[index]) if index == 5 else key[index]
        parts.append(f"{names[index]}={value}")
    return " ".join(parts)


def _varying(keys: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], set[int]]:
    """Fields that tell apart rows sharing a strategy and amp level (only those go into a label)."""
    result = {}
    for key in keys:
        peers = [k for k in keys if k[:2] == key[:2]]
        result[key] = {i for i in range(2, len(key)) if len({k[i] for k in peers}) > 1}
    return result


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _row(group: list[dict[str, Any]], label: str) -> Row:
    first = group[0]
    ok = [r for r in group if r.get("status") == "ok"]
    statuses = sorted({r.get("status", "?") for r in group})
    status = statuses[0] if len(statuses) == 1 else "/".join(f"{s} {sum(r['status'] == s for r in group)}" for s in statuses)
    reasons = [r.get("error") for r in group if r.get("error")]
    row = Row(label=label, strategy=first.get("strategy", "?"), amp=first.get("amp", "?"),
              model=first.get("model", "?"), devices=list(first.get("devices") or []),
              processes=_median_int([_rank_pids(r) for r in (ok or group)]), global_batch=first.get("global_batch"),
              status=status, reason=reasons[0] if reasons else None, runs=len(group), ok_runs=len(ok))
    if not ok:
        return row

    steady = [w["seconds"] * PER / r["log_every"] for r in ok for w in r["windows"] if not w["warmup"]]
    row.steady_windows = len(steady)
    if steady:
        row.s_per_20 = statistics.median(steady)
        row.s_per_20_p10, row.s_per_20_p90 = percentile(steady, 10), percentile(steady, 90)
    edges: dict[int, list[float]] = {}
    losses: dict[int, list[float]] = {}
    for r in ok:
        for w in r["windows"]:
            edges.setdefault(w["end_iter"], []).append(w["cumulative_seconds"])
            if w.get("loss") is not None:
                losses.setdefault(w["end_iter"], []).append(w["loss"])
    row.cumulative = [(it, statistics.median(v)) for it, v in sorted(edges.items()) if len(v) == len(ok)]
    row.losses = [(it, statistics.median(v)) for it, v in sorted(losses.items())]
    row.final_loss = row.losses[-1][1] if row.losses else None

    rates = [r["throughput_img_s"] for r in ok if r.get("throughput_img_s")]
    row.spread_known = len(rates) >= 2 or len(steady) >= 3
    if rates:
        row.throughput = statistics.median(rates)
        if len(rates) > 1:
            row.throughput_lo, row.throughput_hi = min(rates), max(rates)
        else:
            per_window = [ok[0]["global_batch"] * ok[0]["log_every"] / w["seconds"]
                          for w in ok[0]["windows"] if not w["warmup"] and w["seconds"] > 0]
            if per_window:  # the run's rate lies within its windows' range; keep the spread around it
                row.throughput_lo = min(percentile(per_window, 10), row.throughput)
                row.throughput_hi = max(percentile(per_window, 90), row.throughput)
    startups = [r["startup_seconds"] for r in ok if r.get("startup_seconds") is not None]
    row.startup_s = statistics.median(startups) if startups else None
    _pool_memory(row, ok)
    return row


def _rank_pids(results: dict[str, Any]) -> int:
    per_process = (results.get("memory") or {}).get("per_process", [])
    return len({(p.get("node"), p["pid"]) for p in per_process if p.get("role") == "rank"})


def _median_int(values: Sequence[int]) -> int | None:
    values = [v for v in values if v]
    return int(statistics.median_low(values)) if values else None


def _pool_memory(row: Row, ok: Sequence[dict[str, Any]]) -> None:
    """Memory of every repeat: per device the median of the repeats' use, the row's figures the median of
    the repeats' largest (and smallest) device, with min-max over repeats as the spread."""
    balances = [imbalance.analyze(r) for r in ok]
    runs = [b for b in balances if b.devices]
    row.sources = sorted({(r.get("memory") or {}).get("source") or "none" for r in ok})
    row.memory_source = row.sources[0] if len(row.sources) == 1 else "+".join(row.sources)
    if not runs:
        return
    per_device: dict[str, list[float]] = {}
    pids: dict[str, set[int]] = {}
    for balance in runs:
        for d in balance.devices:
            per_device.setdefault(d["device"], []).append(d["used_mib"])
            pids.setdefault(d["device"], set()).update(d["pids"])
    row.memory_per_device = [{"device": device, "used_mib": statistics.median(used), "pids": sorted(pids[device])}
                             for device, used in per_device.items()]
    maxima = [max(d["used_mib"] for d in b.devices) for b in runs]
    row.mem_max_mib = statistics.median(maxima)
    row.mem_min_mib = statistics.median(min(d["used_mib"] for d in b.devices) for b in runs)
    if len(maxima) >= 2:
        row.mem_max_lo, row.mem_max_hi = min(maxima), max(maxima)
    excess = [b.base_excess_pct for b in runs if b.base_excess_pct is not None]
    row.mem_imbalance_pct = statistics.median(excess) if excess else None


def build_rows(found: Sequence[tuple[Path, dict[str, Any]]], baseline: str | None = None) -> tuple[list[Row], str | None]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for _, results in found:
        groups.setdefault(_key(results), []).append(results)
    varying = _varying(list(groups))
    keys = list(groups)
    rows = [_row(groups[k], _label(groups[k], varying[k])) for k in keys]
    base = _pick_baseline(rows, baseline)
    if base is not None and base.throughput:
        for row in rows:
            if row.throughput:
                row.speedup = row.throughput / base.throughput
    for key, row in zip(keys, rows, strict=True):
        reference = _one_device_reference(key, row, keys, rows)
        if row.throughput and reference is not None and reference.throughput:
            row.efficiency = row.throughput / (reference.throughput * row.n_devices)
    return rows, base.label if base else None


def _one_device_reference(key: tuple[Any, ...], row: Row, keys: Sequence[tuple[Any, ...]],
                          rows: Sequence[Row]) -> Row | None:
    """What a multi-device row's efficiency is measured against: the one-device run of the same model, batch,
    image size and amp level (`single` first). One-device rows have no efficiency: there is nothing to scale."""
    if row.n_devices < 2:
        return None
    same = [r for k, r in zip(keys, rows, strict=True)
            if r.n_devices == 1 and r.throughput and k[1:5] == key[1:5] and k[6:8] == key[6:8]]
    same.sort(key=lambda r: r.strategy != "single")
    return same[0] if same else None


def _pick_baseline(rows: Sequence[Row], wanted: str | None) -> Row | None:
    ok = [r for r in rows if r.throughput]
    if wanted:
        strategy, _, amp = wanted.partition(":")
        match = [r for r in ok if r.strategy == strategy and (not amp or r.amp == amp)]
        if match:
            return match[0]
        warnings.warn(f"baseline {wanted} has no ok row; using the default baseline", stacklevel=2)
    single = [r for r in ok if r.strategy == "single" and r.amp == "O0" and r.n_devices == 1]
    return (single or ok or [None])[0]


# ---- which figure wins: only differences larger than the run-to-run spread ----

def winners(rows: Sequence[Row]) -> dict[str, str]:
    """Column -> label of the row that is best by more than the run-to-run spread (no entry where it is a
    tie, or where the spread of the best two is unknown: one run with fewer than 3 steady windows; for
    memory, fewer than 2 repeats)."""
    result = {}
    ok = [r for r in rows if r.throughput]
    by_rate = sorted(ok, key=lambda r: r.throughput or 0, reverse=True)
    if len(by_rate) >= 2 and all(r.spread_known for r in by_rate[:2]):
        best, second = by_rate[0], by_rate[1]
        if (best.throughput_lo or best.throughput) > (second.throughput_hi or second.throughput):
            result["throughput"] = best.label
    timed = sorted((r for r in ok if r.s_per_20), key=lambda r: r.s_per_20 or 0)
    if len(timed) >= 2 and all(r.spread_known for r in timed[:2]) and \
            (timed[0].s_per_20_p90 or 0) < (timed[1].s_per_20_p10 or 0):
        result["s_per_20"] = timed[0].label
    mem = sorted((r for r in ok if r.mem_max_mib is not None), key=lambda r: r.mem_max_mib or 0)
    if len(mem) >= 2 and mem[0].mem_max_hi is not None and mem[1].mem_max_lo is not None and \
            mem[0].mem_max_hi < mem[1].mem_max_lo:
        result["mem_max_mib"] = mem[0].label
    return result


def reproducibility(rows: Sequence[Row]) -> str:
    """One sentence on how far the figures can be trusted: the spread of the steady windows, and which rows'
    spread is unknown."""
    known = [r for r in rows if r.throughput and r.spread_known and r.s_per_20]
    unknown = [r.label for r in rows if r.throughput and not r.spread_known]
    parts = []
    if known:
        widths = sorted(100 * ((r.s_per_20_p90 or 0) - (r.s_per_20_p10 or 0)) / (r.s_per_20 or 1) for r in known)
        parts.append(f"steady windows vary by {statistics.median(widths):.0f} % (median p10–p90 width over "
                     f"{len(known)} rows; widest {widths[-1]:.0f} %): differences smaller than that are noise")
    if unknown:
        parts.append("spread unknown (one run, fewer than 3 steady windows; no ★ possible) for " + ", ".join(unknown))
    return "; ".join(parts) or "no row measured"


# ---- writers ----

def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def table_rows(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """The pretty table (report.md, index.html): formatted cells, units in the cells."""
    edges = sorted({it for r in rows for it, _ in r.cumulative})
    header = ["combination", "devices", "procs", "batch", f"s/{PER} it (p10–p90)", *[f"{it} it" for it in edges],
              "img/s", "speedup", "efficiency", "mem max MiB", "mem min MiB", "imbalance", "final loss", "startup s",
              "status"]
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
                     _fmt(r.mem_max_mib, 0) + mem_spread, _fmt(r.mem_min_mib, 0), _fmt(r.mem_imbalance_pct, 0, "%"),
                     _fmt(r.final_loss, 4), _fmt(r.startup_s, 1), status])
    return header, body


# report.csv: one plain number per cell ("nan" where there is none), units in the header, for tools
CSV_TEXT = ("combination", "strategy", "amp", "model", "devices", "status", "reason")
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
    ("startup_s", lambda r: r.startup_s),
)


def write_csv(rows: Sequence[Row], path: Path) -> None:
    edges = sorted({it for r in rows for it, _ in r.cumulative})
    header = [*CSV_TEXT, *(name for name, _ in CSV_NUMBERS), *(f"cumulative_s_at_{it}" for it in edges)]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for r in rows:
            text = [r.label, r.strategy, r.amp, r.model, " ".join(r.devices), r.status, r.reason or ""]
            cumulative = dict(r.cumulative)
            numbers = [get(r) for _, get in CSV_NUMBERS] + [cumulative.get(it) for it in edges]
            writer.writerow(text + ["nan" if v is None else repr(float(v)) if isinstance(v, float) else v
                                    for v in numbers])


def to_markdown(rows: Sequence[Row], baseline: str | None, skipped: Sequence[str]) -> str:
    header, body = table_rows(rows)
    lines = ["# Strategies side by side", "",
             f"Baseline for speedup: {baseline or 'none (no ok run)'}. Times are medians over steady-state windows "
             f"(warm-up excluded), normalised to {PER} iterations; the cumulative columns are the time at each "
             "iteration count, as in the original hand-made table. Memory is peak minus the pre-run baseline "
             "(median over repeats, min–max in brackets). Efficiency is the speedup of a multi-device row over "
             "the one-device row at the same amp level, divided by its devices.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in body]
    won = winners(rows)
    lines += ["", "Clear wins (larger than the run-to-run spread): " +
              (", ".join(f"{k}: {v}" for k, v in won.items()) or "none"),
              "", f"How reproducible: {reproducibility(rows)}."]
    if skipped:
        lines += ["", "Unreadable results files (skipped):", *[f"- {s}" for s in skipped]]
    return "\n".join(lines) + "\n"


def write_plots(rows: Sequence[Row], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.throughput or r.cumulative]
    if not ok:
        return []
    note = ""
    if len(ok) > PLOT_ROWS:  # beyond this, legends and labels are unreadable (and slow to lay out)
        ranked = sorted(ok, key=lambda r: r.throughput or 0, reverse=True)[:PLOT_ROWS]
        ok = [r for r in ok if r in ranked]
        note = f" (top {PLOT_ROWS} by throughput; every row is in report.md)"
    written = []

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in ok:
        if r.cumulative:
            xs, ys = zip(*[(0, 0.0), *r.cumulative], strict=True)
            ax.plot(xs, ys, marker="o", label=r.label)
    ax.set(xlabel="iterations", ylabel="cumulative time (s)", title="Cumulative training time" + note)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    written.append(_save(fig, out_dir / "cumulative_time.png"))

    rated = [r for r in ok if r.throughput]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rated) + 1.5))
    ys = range(len(rated))
    lo = [r.throughput - (r.throughput_lo or r.throughput) for r in rated]
    hi = [(r.throughput_hi or r.throughput) - r.throughput for r in rated]
    ax.barh(list(ys), [r.throughput for r in rated], xerr=[lo, hi], color="tab:blue", capsize=3)
    ax.set_yticks(list(ys), [r.label for r in rated], fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="throughput (images/s, steady state; bars: spread)", title="Throughput" + note)
    ax.grid(axis="x", alpha=0.3)
    written.append(_save(fig, out_dir / "throughput.png"))

    with_mem = [r for r in ok if r.memory_per_device]
    if with_mem:
        fig, ax = plt.subplots(figsize=(min(24, max(8, 0.8 * sum(len(r.memory_per_device) for r in with_mem))), 6))
        x, ticks, tick_labels = 0.0, [], []
        for r in with_mem:
            start = x
            for d in r.memory_per_device:
                bar = ax.bar(x, d["used_mib"], width=0.8, color="tab:orange")
                pid_text = "PID " + ",".join(map(str, d["pids"])) if d["pids"] else "no PID"
                ax.bar_label(bar, labels=[f"{d['device']}\n{pid_text}"], fontsize=7, padding=2)
                x += 1
            ticks.append((start + x - 1) / 2)
            tick_labels.append(r.label)
            x += 0.8
        ax.set_xticks(ticks, tick_labels, fontsize=8, rotation=20, ha="right")
        ax.set(ylabel="peak memory above baseline (MiB)", title="Memory per device (labels: device and PIDs)" + note)
        ax.margins(y=0.2)
        written.append(_save(fig, out_dir / "memory_per_device.png"))

    lossy = [r for r in ok if r.losses]
    if lossy:
        fig, ax = plt.subplots(figsize=(8, 5))
        for r in lossy:
            xs, ys = zip(*r.losses, strict=True)
            ax.plot(xs, ys, marker="o", label=r.label)
        ax.set(xlabel="iterations", ylabel="training loss (cross-entropy, at window end)", title="Loss" + note)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        written.append(_save(fig, out_dir / "loss.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def to_html(rows: Sequence[Row], baseline: str | None, pngs: Sequence[Path], skipped: Sequence[str]) -> str:
    header, body = table_rows(rows)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
    imgs = "".join(f'<figure><img src="{html.escape(p.name)}" alt="{html.escape(p.stem)}"></figure>' for p in pngs)
    warn = "".join(f"<li>{html.escape(s)}</li>" for s in skipped)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Strategies side by side</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}} td:first-child{{text-align:left}}
img{{max-width:100%}} figure{{display:inline-block;margin:1em;max-width:46%}}</style></head>
<body><h1>Strategies side by side</h1>
<p>Baseline for speedup: {html.escape(baseline or "none")}. Medians of steady-state windows, per {PER} iterations.</p>
<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>
{f"<h2>Unreadable results files</h2><ul>{warn}</ul>" if warn else ""}
{imgs}
</body></html>
"""


def terminal_table(rows: Sequence[Row], baseline: str | None) -> str:
    """The terminal's short form, as text (the full table with cumulative times is in report.md)."""
    from rich.markup import escape
    from rich.table import Table

    from harness.output.console import render

    won = winners(rows)
    table = Table(title=f"Strategies side by side (speedup against {baseline}; ★ = best by more than the spread)",
                  title_justify="left")
    columns = ["combination", "devices", "procs", f"s/{PER} it", "img/s", "speedup", "efficiency", "mem max MiB",
               "imbalance", "final loss", "status"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("combination", "status") else "right")
    notes = []
    for row in rows:
        star = {k: "★ " if won.get(k) == row.label else "" for k in ("throughput", "s_per_20", "mem_max_mib")}
        status = row.status
        if row.reason:
            notes.append(f"[{len(notes) + 1}] {row.label}: {row.reason}")
            status += f" [{len(notes)}]"
        unknown = "?" if row.s_per_20 is not None and not row.spread_known else ""
        table.add_row(escape(row.label), str(len(row.devices)), str(row.processes or "—"),
                      star["s_per_20"] + _fmt(row.s_per_20, 3) + unknown,
                      star["throughput"] + _fmt(row.throughput, 1) + unknown,
                      _fmt(row.speedup, 2, "×"), _fmt(row.efficiency and 100 * row.efficiency, 0, "%"),
                      star["mem_max_mib"] + _fmt(row.mem_max_mib, 0), _fmt(row.mem_imbalance_pct, 0, "%"),
                      _fmt(row.final_loss, 4), escape(status))
    lines = [render(table), *notes, f"How reproducible: {reproducibility(rows)}" +
             ("; ? = spread unknown" if any(r.throughput and not r.spread_known for r in rows) else "")]
    return "\n".join(lines)


def build_report(paths: Sequence[Path], out_dir: Path, baseline: str | None = None, quiet: bool = False) -> Report:
    found, skipped = find_results(paths)
    for entry in skipped:
        log.warning("skipping unreadable results file %s", entry)
    rows, base = build_rows(found, baseline)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(rows=rows, baseline=base, skipped_files=skipped)
    (out_dir / "report.md").write_text(to_markdown(rows, base, skipped))
    write_csv(rows, out_dir / "report.csv")
    write_json_atomic(out_dir / "report.json", {"baseline": base, "skipped_files": skipped,
                                                  "winners": winners(rows), "rows": [asdict(r) for r in rows]})
    pngs = write_plots(rows, out_dir)
    (out_dir / "index.html").write_text(to_html(rows, base, pngs, skipped))
    report.outputs = [out_dir / n for n in ("report.md", "report.csv", "report.json", "index.html")] + pngs
    if not quiet:
        log.info("%s", terminal_table(rows, base))
        log.info("report: %s", out_dir / "index.html")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="folders (searched recursively) or results.json files")
    parser.add_argument("--out", type=Path, help="where to write (default: the folder given, or the first)")
    parser.add_argument("--baseline", help="row the speedups are against, as strategy:amp (default single:O0)")
    args = parser.parse_args(argv)
    setup_cli()
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        log.error("paths=%s do not exist: give folders holding results.json files", ",".join(missing))
        return 2
    out = args.out or (args.paths[0] if args.paths[0].is_dir() else args.paths[0].parent)
    report = build_report(args.paths, out, args.baseline)
    if not report.rows:
        log.error("no results.json found under %s", ", ".join(map(str, args.paths)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
