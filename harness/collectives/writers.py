"""The benchmark's outputs beside collectives.json: the Markdown table, the CSV and the bandwidth plot."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.collectives.arithmetic import format_size

COLUMNS = ("op", "size", "size_bytes", "count", "time_us", "time_us_min", "time_us_max", "algbw_gbs",
           "busbw_gbs", "bus_factor")


def to_markdown(rows: Sequence[Mapping[str, Any]], header: Mapping[str, Any], unsupported: Mapping[str, str]) -> str:
    lines = ["# Collectives benchmark", "",
             f"{header['backend']} · {header['world_size']} ranks · devices {', '.join(header['devices'])} · "
             f"{header['dtype']} · {header['repeats']} timed calls per size after {header['warmup']} warm-up", "",
             "Time: median over the timed calls of the slowest rank's time (barrier before, device sync after). "
             "algbw = size / time; busbw = algbw × factor (nccl-tests: all_reduce 2(n−1)/n; all_gather, "
             "reduce_scatter, gather, scatter (n−1)/n; broadcast, reduce, sendrecv 1). For all_gather, "
             "reduce_scatter, gather and scatter the size is the total buffer. GB/s = 1e9 bytes/s.", "",
             "| op | size | bytes | time µs (median) | min–max µs | algbw GB/s | busbw GB/s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {format_size(r['size_bytes'])} | {r['size_bytes']} | {r['time_us']:.1f} | "
                     f"{r['time_us_min']:.1f}–{r['time_us_max']:.1f} | {r['algbw_gbs']:.3f} | {r['busbw_gbs']:.3f} |")
    for op, reason in unsupported.items():
        lines.append(f"| {op} | — | — | — | — | — | not measured {reason.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for r in rows:
            writer.writerow([format_size(r["size_bytes"]) if c == "size" else r[c] for c in COLUMNS])


def write_plot(rows: Sequence[Mapping[str, Any]], header: Mapping[str, Any], path: Path) -> Path | None:
    """Bus bandwidth and time against size, log axes, one line per op."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (bw_ax, time_ax) = plt.subplots(1, 2, figsize=(13, 5))
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        sizes = [r["size_bytes"] for r in mine]
        if all(r["busbw_gbs"] > 0 for r in mine):  # one rank: factors (n-1)/n are 0, nothing to draw on log axes
            bw_ax.plot(sizes, [r["busbw_gbs"] for r in mine], marker="o", label=op)
        time_ax.plot(sizes, [r["time_us"] for r in mine], marker="o", label=op)
    sized = FuncFormatter(lambda x, _: format_size(int(x)) if x >= 1 else "")
    for ax in (bw_ax, time_ax):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(sized)
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        ax.grid(alpha=0.3, which="both")
        ax.set_xlabel("message size (total buffer for gather-type ops)")
    bw_ax.set(ylabel="bus bandwidth (GB/s, nccl-tests convention)", title="Bus bandwidth")
    time_ax.set(ylabel="time per call (µs, median)", title="Latency")
    for ax in (bw_ax, time_ax):
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(f"{header['backend']} · {header['world_size']} ranks · {', '.join(header['devices'])} · "
                 f"{header['dtype']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

