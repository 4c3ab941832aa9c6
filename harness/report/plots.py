"""The report's PNG plots. One encoding everywhere: colour is the strategy, line style, marker and hatching
are the amp level, so `single O0` and `allreduce O2` never look alike; combinations that did not run are
named in a note on every plot rather than silently absent."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.memory.report import MemorySection
from harness.profile.report import ProfileSection
from harness.report.rows import Row

WIDTH_IN, DPI = 9.0, 150  # at a 1400 px page (one plot per row, ≤ 1100 px wide) 8-point text is ≥ 9 px
FONT = 9  # points: tick labels, legends, notes
FIRST = ("single", "dp", "ddp", "apex_ddp", "allreduce", "ignite", "zero", "fsdp")  # the colours reports had
# Every strategy with a yaml gets a stable colour without touching this file: the historical ones keep theirs,
# the rest follow in name order.
STRATEGY_ORDER = FIRST + tuple(sorted(
    p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "strategy").glob("*.yaml") if p.stem not in FIRST))
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2", "#7f7f7f",
           "#bcbd22", "#393b79", "#637939")
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


def ordered(rows: Sequence[Row]) -> list[Row]:
    """Grouped by strategy, then amp level (bars of one strategy sit together)."""
    colours = strategy_colours(rows)
    order = list(colours)
    return sorted(rows, key=lambda r: (order.index(r.strategy), r.amp, r.label))


VARIANT_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<")


def variant_markers(rows: Sequence[Row]) -> dict[str, str]:
    """A marker per row among rows sharing a strategy and amp level (their colour and line are the same)."""
    seen: dict[tuple[str, str], int] = {}
    markers = {}
    for r in ordered(rows):
        i = seen.get((r.strategy, r.amp), 0)
        seen[(r.strategy, r.amp)] = i + 1
        markers[r.label] = VARIANT_MARKERS[i % len(VARIANT_MARKERS)]
    return markers


def legends(ax: Any, rows: Sequence[Row], colours: dict[str, str], bars: bool) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if not bars and len({(r.strategy, r.amp) for r in rows}) < len(rows):
        # variants of one strategy and amp level: an entry per row (its colour, line and own marker)
        markers = variant_markers(rows)
        handles = [Line2D([], [], color=colours[r.strategy], linestyle=style(r, colours)["linestyle"],
                          marker=markers[r.label], label=r.label) for r in ordered(rows)]
        ax.legend(handles=handles, fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        return
    strategies = [Patch(facecolor=colours[s], label=s) for s in dict.fromkeys(r.strategy for r in ordered(rows))]
    amps = sorted({r.amp for r in rows})
    if bars:
        levels = [Patch(facecolor="white", edgecolor="black", hatch=AMP_STYLE.get(a, ("", "", ""))[2], label=a)
                  for a in amps]
    else:
        levels = [Line2D([], [], color="black", linestyle=AMP_STYLE.get(a, ("-",))[0],
                         marker=AMP_STYLE.get(a, ("-", "o"))[1], label=a) for a in amps]
    first = ax.legend(handles=strategies, title="strategy", fontsize=FONT, title_fontsize=FONT, loc="upper left",
                      bbox_to_anchor=(1.01, 1.0))
    ax.add_artist(first)
    ax.legend(handles=levels, title="amp", fontsize=FONT, title_fontsize=FONT, loc="lower left",
              bbox_to_anchor=(1.01, 0.0))


def write_plots(rows: Sequence[Row], out_dir: Path, baseline: str | None = None) -> list[Path]:
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # "generated new fontManager" is not the report's
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in rows if r.throughput or r.cumulative]
    if not ran:
        return []
    missing = [r for r in rows if not r.throughput and not r.cumulative]
    ran = ordered(ran)  # every combination that ran, in every plot: none is cut for another's sake
    colours = strategy_colours(rows)
    footer = (f"{len(missing)} combination{'s' if len(missing) > 1 else ''} did not run here (listed in the report)"
              if missing else "")
    written = []
    plt.rcParams.update({"font.size": FONT, "axes.titlesize": FONT + 2, "axes.labelsize": FONT,
                         "xtick.labelsize": FONT, "ytick.labelsize": FONT, "legend.fontsize": FONT})

    fig, ax = plt.subplots(figsize=(WIDTH_IN, 5))
    markers = variant_markers(ran) if len({(r.strategy, r.amp) for r in ran}) < len(ran) else {}
    for r in ran:
        if r.cumulative:
            xs, ys = zip(*[(0, 0.0), *r.cumulative], strict=True)
            s = style(r, colours)
            ax.plot(xs, ys, color=s["color"], linestyle=s["linestyle"], marker=markers.get(r.label, s["marker"]),
                    label=r.label)
    ax.set(xlabel="iterations", ylabel="cumulative time (s, median over repeats)", title="Cumulative training time")
    ax.grid(alpha=0.3)
    legends(ax, ran, colours, bars=False)
    written.append(_save(fig, out_dir / "cumulative_time.png", footer))

    fig = throughput_figure(ran, rows, baseline)
    written.append(_save(fig, out_dir / "throughput.png", footer))

    with_mem = [(r, r.memory) for r in ran if r.memory and r.memory.per_device]
    if with_mem:
        written.append(_memory_plot(with_mem, colours, out_dir / "memory_per_device.png", footer))

    lossy = [r for r in ran if len(r.losses) >= 2]
    if lossy:
        fig, ax = plt.subplots(figsize=(WIDTH_IN, 5))
        for r in lossy:
            xs, ys2 = zip(*r.losses, strict=True)
            s = style(r, colours)
            ax.plot(xs, ys2, color=s["color"], linestyle=s["linestyle"], marker=markers.get(r.label, s["marker"]),
                    label=r.label)
        ax.set(xlabel="iterations", ylabel="training loss at the window's end (cross-entropy)",
               title="Loss (the same batches for every combination)")
        ax.grid(alpha=0.3)
        legends(ax, lossy, colours, bars=False)
        written.append(_save(fig, out_dir / "loss.png", footer))

    profiled = [(r, r.profile) for r in ran if r.profile and r.profile.breakdown]
    if profiled:
        written.append(_breakdown_plot(profiled, colours, out_dir / "breakdown.png", footer))
    return written


WHISKER_ROOM = 1.5  # the throughput axis ends at most this far past the longest judged bar, whatever a whisker says


def whiskered(row: Row) -> bool:
    """Only a judged row's interval is drawn: a busy row or one whose spread is unknown has none to show."""
    return bool(row.throughput and not row.busy and row.spread_known and row.throughput_lo is not None
                and row.throughput_hi is not None)


def throughput_limit(rated: Sequence[Row]) -> float:
    """Where the throughput axis ends: past the longest bar (a busy row's only where no row was judged), and past
    the whiskers as far as WHISKER_ROOM allows. An absurd interval (6,700 img/s beside bars of 700) or a busy
    row's figure never squashes the bars into a corner: it is cut at the axis, and says so."""
    bars = [r.throughput for r in rated if r.throughput and not r.busy] or [r.throughput for r in rated
                                                                              if r.throughput]
    top = max(bars)
    reach = max((r.throughput_hi for r in rated if whiskered(r) and r.throughput_hi), default=top)
    return max(1.15 * top, min(1.05 * reach, WHISKER_ROOM * top))


def throughput_figure(ran: Sequence[Row], rows: Sequence[Row], baseline: str | None) -> Any:
    """Bars of throughput with the judged rows' 95 % intervals, the baseline as a line. The axis is the bars'
    (throughput_limit): a whisker past it ends in an arrow with its end written beside it, a busy bar past it
    is cut with its figure written."""
    import matplotlib.pyplot as plt

    colours = strategy_colours(rows)
    rated = [r for r in ran if r.throughput]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.3 * len(rated) + 1.8))
    ys = list(range(len(rated)))
    right = throughput_limit(rated) if rated else 1.0
    clipped = False
    for y, r in zip(ys, rated, strict=True):
        s = style(r, colours)
        value = r.throughput or 0.0
        ax.barh(y, min(value, right), color=s["color"], hatch=s["hatch"], edgecolor="black", linewidth=0.5)
        if r.busy and value > right:
            ax.text(right, y, f" {value:.0f} (busy) ▸", fontsize=FONT, va="center", ha="right")
        if not whiskered(r) or r.throughput_lo is None or r.throughput_hi is None:
            continue  # not judged: no interval to draw
        if r.throughput_hi <= right:
            ax.errorbar(value, y, xerr=[[value - r.throughput_lo], [r.throughput_hi - value]], fmt="none",
                        ecolor="black", elinewidth=1, capsize=3)
            continue
        clipped = True
        ax.errorbar(value, y, xerr=[[value - r.throughput_lo], [0.0]], fmt="none", ecolor="black", elinewidth=1,
                    capsize=3)
        ax.annotate("", xy=(right, y), xytext=(value, y), arrowprops={"arrowstyle": "-|>", "color": "black",
                                                                       "lw": 1, "shrinkA": 0, "shrinkB": 0})
        ax.text(right, y - 0.25, f"to {r.throughput_hi:.0f} ", fontsize=FONT - 1, va="bottom", ha="right")
    base = next((r for r in rows if r.label == baseline), None)
    if base is not None and base.throughput and base.throughput <= right:
        ax.axvline(base.throughput, color="black", linestyle="--", linewidth=1)
        ax.text(base.throughput, -0.6, f" baseline {base.label}", fontsize=FONT, va="bottom")
    ax.set_xlim(0, right)
    ax.set_yticks(ys, [r.label + (" (busy)" if r.busy else "") for r in rated], fontsize=FONT)
    ax.invert_yaxis()
    said = "; ▸ a whisker past the axis, its end written" if clipped else ""
    ax.set(xlabel=f"throughput (images/s, steady state; whiskers: 95 % interval from the runs{said})",
           title="Throughput")
    ax.grid(axis="x", alpha=0.3)
    legends(ax, rated, colours, bars=True)
    return fig


PART_COLOURS = {"compute": "#4c72b0", "communication": "#dd8452", "data_wait": "#c44e52", "optimizer": "#55a868",
                "other": "#bbbbbb"}


def _breakdown_plot(profiled: Sequence[tuple[Row, ProfileSection]], colours: dict[str, str], path: Path,
                    footer: str) -> Path:
    """One stacked bar per combination: where its profiled window's time went (shares of the window, the
    slowest rank's), with the communication that overlapped other work noted beside it."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = [r for r, _ in profiled]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.35 * len(rows) + 2.0))
    for y, (_, found) in enumerate(profiled):
        left = 0.0
        for part, colour in PART_COLOURS.items():
            share = 100 * found.breakdown.get(part, 0.0)
            ax.barh(y, share, left=left, color=colour, edgecolor="white", linewidth=0.5)
            if share >= 6:
                ax.text(left + share / 2, y, f"{share:.0f}", ha="center", va="center", fontsize=FONT - 1,
                        color="white")
            left += share
        if found.comm_overlapped_share is not None:
            ax.text(101, y, f"comm overlapped {100 * found.comm_overlapped_share:.0f} %", va="center",
                    fontsize=FONT - 1)
    ax.set_yticks(range(len(rows)), [r.label for r in rows], fontsize=FONT)
    for tick, r in zip(ax.get_yticklabels(), rows, strict=True):
        tick.set_color(colours[r.strategy])
    ax.invert_yaxis()
    ax.set_xlim(0, 135)
    views = sorted({found.view or "?" for _, found in profiled})
    ax.set(xlabel=f"share of the profiled window (%; {'/'.join(views)} view; the slowest rank)",
           title="Where the time goes (profile=true)")
    ax.legend(handles=[Patch(color=c, label=p.replace("_", " ")) for p, c in PART_COLOURS.items()], fontsize=FONT,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path, footer)


MEMORY_AXIS = {
    "nvml": "GPU memory in use above the pre-run baseline (MiB, NVML)",
    "torch-allocator": "allocator's reserved peak per GPU (MiB)",
    "psutil": "worker process's resident memory growth (MiB)\n(CPU: a process's memory, not a device's)",
}


def _memory_plot(with_mem: Sequence[tuple[Row, MemorySection]], colours: dict[str, str], path: Path,
                 footer: str) -> Path:
    """Horizontal bars, one per device of each combination (the combination's label on its first bar, the
    device and the PIDs holding it beside each bar), the theory per rank as a dotted mark: as readable with
    40 combinations as with 4 (the plot grows downwards)."""
    import matplotlib.pyplot as plt

    bars = sum(len(found.per_device) for _, found in with_mem)
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.28 * bars + 0.2 * len(with_mem) + 1.6))
    y, ticks, labels = 0.0, [], []
    theory_drawn = False
    top = max(d.used_mib for _, found in with_mem for d in found.per_device) or 1.0
    for r, found in with_mem:
        s = style(r, colours)
        first = y
        for i, d in enumerate(found.per_device):
            ax.barh(y, d.used_mib, height=0.8, color=s["color"], hatch=s["hatch"], edgecolor="black",
                    linewidth=0.5)
            pids = f"PID {max(d.pids)}" + (f" (+{len(d.pids) - 1} in other runs)" if len(d.pids) > 1
                                           else "") if d.pids else "no PID"
            ax.text(d.used_mib + top * 0.01, y, f"{d.used_mib:.0f} MiB · {pids}", va="center", fontsize=FONT - 1)
            ticks.append(y)
            device = d.device.rpartition("/")[2] if "/" in d.device else d.device
            labels.append(f"{r.label}  {device}" if i == 0 else device)
            y += 1
        if found.theory_mib is not None:  # what parameters, gradients and optimizer state take per rank in theory
            ax.vlines(found.theory_mib, first - 0.45, y - 0.55, colors="black", linestyles=":", linewidth=1.5)
            theory_drawn = True
        y += 0.6
    ax.set_yticks(ticks, labels, fontsize=FONT)
    owners = [row for row, found in with_mem for _ in found.per_device]
    for tick, owner in zip(ax.get_yticklabels(), owners, strict=True):
        tick.set_color(colours[owner.strategy])
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.7)  # room for the figures and PIDs beside the longest bar
    sources = {found.source for _, found in with_mem}
    xlabel = MEMORY_AXIS.get(next(iter(sources)), "memory (MiB)") if len(sources) == 1 else "memory (MiB; mixed sources)"
    ax.set(xlabel=xlabel, title="Memory per device (and the PIDs holding it)")
    ax.grid(axis="x", alpha=0.3)
    if theory_drawn:
        from matplotlib.lines import Line2D

        ax.legend(handles=[Line2D([], [], color="black", linestyle=":", label="params + grads + optimizer state "
                                  "per rank, in theory")], fontsize=FONT, loc="lower right")
    return _save(fig, path, footer)


def _save(fig: Any, path: Path, footer: str = "") -> Path:
    import textwrap

    import matplotlib.pyplot as plt

    if footer:
        fig.text(0.01, 0.005, "\n".join(textwrap.wrap(footer, 100)), fontsize=FONT - 1, ha="left", va="bottom",
                 color="#555")
    fig.tight_layout(rect=(0, 0.05 if footer else 0, 1, 1))
    from matplotlib.legend import Legend

    kept = [c for ax in fig.axes for c in ax.get_children() if isinstance(c, Legend)]  # outside the axes too
    fig.savefig(path, dpi=DPI, bbox_inches="tight", bbox_extra_artists=kept)
    plt.close(fig)
    return path
