"""The report's PNG plots. One encoding everywhere: colour is the strategy, line style, marker and hatching
are the amp level, so `single O0` and `allreduce O2` never look alike; combinations that did not run are
named in a note on every plot rather than silently absent."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.report.rows import Row

PLOT_ROWS = 20  # combinations drawn per plot
FIRST = ("single", "dp", "ddp", "apex_ddp", "allreduce", "ignite", "zero", "fsdp")  # the colours reports had
# Every strategy with a yaml gets a stable colour without touching this file: the historical ones keep theirs,
# the rest follow in name order.
STRATEGY_ORDER = FIRST + tuple(sorted(
    p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "strategy").glob("*.yaml") if p.stem not in FIRST))
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2", "#7f7f7f",
           "#bcbd22")
AMP_STYLE = {  # level -> (line style, marker, bar hatching)
    "O0": ("-", "o", ""), "O1": ("--", "s", "//"), "O2": ("-.", "^", "\\\\"), "O3": (":", "D", "xx"),
}


def strategy_colours(rows: Sequence[Row]) -> dict[str, str]:
    """A colour per strategy, the same for a strategy whatever else the report holds."""
    names = sorted({r.strategy for r in rows}, key=lambda s: (STRATEGY_ORDER.index(s) if s in STRATEGY_ORDER
                                                             else len(STRATEGY_ORDER), s))
    known = {name: PALETTE[STRATEGY_ORDER.index(name)] for name in names if name in STRATEGY_ORDER}
    others = [name for name in names if name not in known]
    return {**known, **{name: PALETTE[(len(STRATEGY_ORDER) + i) % len(PALETTE)] for i, name in enumerate(others)}}


def style(row: Row, colours: dict[str, str]) -> dict[str, Any]:
    line, marker, hatch = AMP_STYLE.get(row.amp, ("-", "o", ""))
    return {"color": colours[row.strategy], "linestyle": line, "marker": marker, "hatch": hatch}


def not_shown(rows: Sequence[Row]) -> str:
    """'not run here: dp O0, dp O1 (skipped); ddp O2 (failed)', for the foot of every plot."""
    by_status: dict[str, list[str]] = {}
    for r in rows:
        if not r.throughput:
            by_status.setdefault(r.status.split(" ")[0], []).append(r.label)
    return "; ".join(f"{', '.join(labels)} ({status})" for status, labels in by_status.items())


def ordered(rows: Sequence[Row]) -> list[Row]:
    """Grouped by strategy, then amp level (bars of one strategy sit together)."""
    colours = strategy_colours(rows)
    order = list(colours)
    return sorted(rows, key=lambda r: (order.index(r.strategy), r.amp, r.label))


def legends(ax: Any, rows: Sequence[Row], colours: dict[str, str], bars: bool) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    strategies = [Patch(facecolor=colours[s], label=s) for s in dict.fromkeys(r.strategy for r in ordered(rows))]
    amps = sorted({r.amp for r in rows})
    if bars:
        levels = [Patch(facecolor="white", edgecolor="black", hatch=AMP_STYLE.get(a, ("", "", ""))[2], label=a)
                  for a in amps]
    else:
        levels = [Line2D([], [], color="black", linestyle=AMP_STYLE.get(a, ("-",))[0],
                         marker=AMP_STYLE.get(a, ("-", "o"))[1], label=a) for a in amps]
    first = ax.legend(handles=strategies, title="strategy", fontsize=8, title_fontsize=8, loc="upper left",
                      bbox_to_anchor=(1.01, 1.0))
    ax.add_artist(first)
    ax.legend(handles=levels, title="amp", fontsize=8, title_fontsize=8, loc="lower left", bbox_to_anchor=(1.01, 0.0))


def write_plots(rows: Sequence[Row], out_dir: Path, baseline: str | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in rows if r.throughput or r.cumulative]
    if not ran:
        return []
    note = not_shown(rows)
    if len(ran) > PLOT_ROWS:  # beyond this, legends and labels are unreadable (and slow to lay out)
        ranked = sorted(ran, key=lambda r: r.throughput or 0, reverse=True)[:PLOT_ROWS]
        note = "; ".join(filter(None, [f"top {PLOT_ROWS} by throughput shown, every row is in report.md", note]))
        ran = [r for r in ran if r in ranked]
    ran = ordered(ran)
    colours = strategy_colours(rows)
    footer = f"not run here: {note}" if note else ""
    written = []

    fig, ax = plt.subplots(figsize=(9, 5))
    for r in ran:
        if r.cumulative:
            xs, ys = zip(*[(0, 0.0), *r.cumulative], strict=True)
            s = style(r, colours)
            ax.plot(xs, ys, color=s["color"], linestyle=s["linestyle"], marker=s["marker"], label=r.label)
    ax.set(xlabel="iterations", ylabel="cumulative time (s, median over repeats)", title="Cumulative training time")
    ax.grid(alpha=0.3)
    legends(ax, ran, colours, bars=False)
    written.append(_save(fig, out_dir / "cumulative_time.png", footer))

    rated = [r for r in ran if r.throughput]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rated) + 1.8))
    ys = list(range(len(rated)))
    for y, r in zip(ys, rated, strict=True):
        s = style(r, colours)
        lo, hi = r.throughput - (r.throughput_lo or r.throughput), (r.throughput_hi or r.throughput) - r.throughput
        ax.barh(y, r.throughput, xerr=[[lo], [hi]], color=s["color"], hatch=s["hatch"], edgecolor="black",
                linewidth=0.5, capsize=3)
    base = next((r for r in rows if r.label == baseline), None)
    if base is not None and base.throughput:
        ax.axvline(base.throughput, color="black", linestyle="--", linewidth=1)
        ax.text(base.throughput, -0.6, f" baseline {base.label}", fontsize=8, va="bottom")
    ax.set_yticks(ys, [r.label for r in rated], fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="throughput (images/s, steady state; whiskers: 95 % interval from the runs)", title="Throughput")
    ax.grid(axis="x", alpha=0.3)
    legends(ax, rated, colours, bars=True)
    written.append(_save(fig, out_dir / "throughput.png", footer))

    with_mem = [r for r in ran if r.memory_per_device]
    if with_mem:
        written.append(_memory_plot(with_mem, colours, out_dir / "memory_per_device.png", footer))

    lossy = [r for r in ran if len(r.losses) >= 2]
    if lossy:
        fig, ax = plt.subplots(figsize=(9, 5))
        for r in lossy:
            xs, ys2 = zip(*r.losses, strict=True)
            s = style(r, colours)
            ax.plot(xs, ys2, color=s["color"], linestyle=s["linestyle"], marker=s["marker"], label=r.label)
        ax.set(xlabel="iterations", ylabel="training loss at the window's end (cross-entropy)",
               title="Loss (the same batches for every combination)")
        ax.grid(alpha=0.3)
        legends(ax, lossy, colours, bars=False)
        written.append(_save(fig, out_dir / "loss.png", footer))

    profiled = [r for r in ran if r.breakdown]
    if profiled:
        written.append(_breakdown_plot(profiled, colours, out_dir / "breakdown.png", footer))
    return written


PART_COLOURS = {"compute": "#4c72b0", "communication": "#dd8452", "data_wait": "#c44e52", "optimizer": "#55a868",
                "other": "#bbbbbb"}


def _breakdown_plot(rows: Sequence[Row], colours: dict[str, str], path: Path, footer: str) -> Path:
    """One stacked bar per combination: where its profiled window's time went (shares of the window, the
    slowest rank's), with the communication that overlapped other work noted beside it."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 2.0))
    for y, r in enumerate(rows):
        left = 0.0
        for part, colour in PART_COLOURS.items():
            share = 100 * r.breakdown.get(part, 0.0)
            ax.barh(y, share, left=left, color=colour, edgecolor="white", linewidth=0.5)
            if share >= 6:
                ax.text(left + share / 2, y, f"{share:.0f}", ha="center", va="center", fontsize=7, color="white")
            left += share
        if r.comm_overlapped_share is not None:
            ax.text(101, y, f"comm overlapped {100 * r.comm_overlapped_share:.0f} %", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [r.label for r in rows], fontsize=8)
    for tick, r in zip(ax.get_yticklabels(), rows, strict=True):
        tick.set_color(colours[r.strategy])
    ax.invert_yaxis()
    ax.set_xlim(0, 135)
    views = sorted({r.breakdown_view or "?" for r in rows})
    ax.set(xlabel=f"share of the profiled window (%; {'/'.join(views)} view; the slowest rank)",
           title="Where the time goes (profile=true)")
    ax.legend(handles=[Patch(color=c, label=p.replace("_", " ")) for p, c in PART_COLOURS.items()], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path, footer)


MEMORY_AXIS = {
    "nvml": "GPU memory in use above the pre-run baseline (MiB, NVML)",
    "torch-allocator": "allocator's reserved peak per GPU (MiB)",
    "psutil": "worker process's resident memory growth (MiB)\n(CPU: a process's memory, not a device's)",
}


def _memory_plot(rows: Sequence[Row], colours: dict[str, str], path: Path, footer: str) -> Path:
    """One group of bars per combination, a bar per device; device names under the bars, PIDs inside them."""
    import matplotlib.pyplot as plt

    bars = sum(len(r.memory_per_device) for r in rows)
    fig, ax = plt.subplots(figsize=(min(26, max(9, 0.6 * bars + 0.6 * len(rows))), 6))
    x, ticks, tick_labels, device_ticks, device_labels = 0.0, [], [], [], []
    theory_drawn = False
    top = max(d["used_mib"] for r in rows for d in r.memory_per_device) or 1.0
    for r in rows:
        s = style(r, colours)
        start = x
        for d in r.memory_per_device:
            ax.bar(x, d["used_mib"], width=0.8, color=s["color"], hatch=s["hatch"], edgecolor="black", linewidth=0.5)
            pids = ",".join(map(str, d["pids"])) or "no PID"
            ax.text(x, top * 0.02, f"PID {pids}", rotation=90, fontsize=7, ha="center", va="bottom", color="white"
                    if d["used_mib"] > 0.3 * top else "black")
            device_ticks.append(x)
            device_labels.append(d["device"].rpartition("/")[2] if "/" in d["device"] else d["device"])
            x += 1
        if r.theory_mib is not None:  # what parameters, gradients and optimizer state take per rank in theory
            ax.hlines(r.theory_mib, start - 0.4, x - 0.6, colors="black", linestyles=":", linewidth=1.5)
            theory_drawn = True
        ticks.append((start + x - 1) / 2)
        tick_labels.append(r.label)
        x += 0.8
    ax.set_xticks(device_ticks, device_labels, fontsize=7, rotation=90 if bars > 8 else 0)
    for tick, label, r in zip(ticks, tick_labels, rows, strict=True):  # the combination above its group of bars
        height = max((d["used_mib"] for d in r.memory_per_device), default=0.0)
        ax.text(tick, height + top * 0.02, label, ha="center", va="bottom", fontsize=8,
                rotation=90 if len(rows) > 8 else 0)
    sources = {r.memory_source for r in rows}
    ylabel = MEMORY_AXIS.get(next(iter(sources)), "memory (MiB)") if len(sources) == 1 else "memory (MiB; mixed sources)"
    ax.set(ylabel=ylabel, title="Memory per device (PIDs in the bars)")
    if theory_drawn:
        from matplotlib.lines import Line2D

        ax.legend(handles=[Line2D([], [], color="black", linestyle=":", label="params + grads + optimizer state "
                                  "per rank, in theory")], fontsize=8, loc="upper right")
    ax.margins(y=0.25 if len(rows) > 8 else 0.1)
    return _save(fig, path, footer)


def _save(fig: Any, path: Path, footer: str = "") -> Path:
    import textwrap

    import matplotlib.pyplot as plt

    if footer:
        fig.text(0.01, 0.005, "\n".join(textwrap.wrap(footer, 150)), fontsize=7, ha="left", va="bottom", color="#555")
    fig.tight_layout(rect=(0, 0.05 if footer else 0, 1, 1))
    from matplotlib.legend import Legend

    kept = [c for ax in fig.axes for c in ax.get_children() if isinstance(c, Legend)]  # outside the axes too
    fig.savefig(path, dpi=110, bbox_inches="tight", bbox_extra_artists=kept)
    plt.close(fig)
    return path
