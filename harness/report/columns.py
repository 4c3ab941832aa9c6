"""Every column of the report, defined once: report.md and index.html show `header` with `cell`, report.csv
the plain values of `csv`, the terminal's short form the columns that have a `terminal` header. A column
added here appears in every output that shows its kind; none is listed twice anywhere else."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.core.results import RunRecord
from harness.memory.report import MemorySection
from harness.parity import report as parity
from harness.prediction.report import PredictionSection
from harness.profile.report import ProfileSection
from harness.report.rows import PER, Row
from harness.verdict.rule import interval_text

BREAKDOWN_HEAD = "compute/comm/data/optim/other %"
BREAKDOWN_PARTS = ("compute", "communication", "data_wait", "optimizer", "other")


def fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "—"
    return f"{round(value, digits) + 0.0:.{digits}f}{suffix}"  # + 0.0: never "-0"


def pct(share: float | None) -> str:
    return fmt(100 * share, 0, "%") if share is not None else "—"


# A row without a feature's section reads as a section with every figure unknown ("—", report.csv's nan).
NO_MEMORY, NO_PROFILE, NO_PREDICTION = MemorySection(), ProfileSection(breakdown={}), PredictionSection()


def memory(row: Row) -> MemorySection:
    return row.memory or NO_MEMORY


def profile(row: Row) -> ProfileSection:
    return row.profile or NO_PROFILE


def prediction(row: Row) -> PredictionSection:
    return row.prediction or NO_PREDICTION


def per_run(figure: Callable[[RunRecord], float | None]) -> Callable[[Row], float | None]:
    """A figure each run measured (a RunRecord field), pooled over the row's finished runs (their median): a
    column reads it so, and a figure added to RunRecord needs nothing between results.json and its column."""
    return lambda row: row.median(figure)


STARTUP_S = per_run(lambda run: run.startup_seconds)
COMPILE_S = per_run(lambda run: run.compile_seconds)
MFU = per_run(lambda run: run.mfu)
DATA_WAIT = per_run(lambda run: run.data_wait_share)
ENERGY = per_run(lambda run: run.energy_j_per_image)


def breakdown_cell(row: Row) -> str:
    """'41/35/19/2/3': the profiled window's shares in percent, in BREAKDOWN_HEAD's order."""
    shares = profile(row).breakdown
    if not shares:
        return "—"
    return "/".join(f"{100 * shares[p]:.0f}" for p in BREAKDOWN_PARTS)


def _always(rows: Sequence[Row]) -> bool:
    return True


def _with_parity(rows: Sequence[Row]) -> bool:
    return any(r.parity is not None for r in rows)


@dataclass(frozen=True)
class Column:
    """One column. `header`/`cell`: the formatted table (report.md, index.html; None: report.csv only).
    `csv`: report.csv's columns from it, (name, value) with plain numbers or text. `terminal`/`terminal_cell`:
    the terminal's short form (None: not there). `star`: the `winners()` figure that earns it a ★. `numeric`:
    index.html sorts it by the number its cells start with. `shown`: whether the sweep's rows need it at all.
    `section`: the question whose table holds it in report.md and index.html. `parts`: the separator of a cell
    listing several things (devices), where index.html breaks it rather than widen its table."""

    header: str | None
    cell: Callable[[Row], str] | None = None
    csv: tuple[tuple[str, Callable[[Row], Any]], ...] = ()
    terminal: str | None = None
    terminal_cell: Callable[[Row], str] | None = None
    star: str | None = None
    numeric: bool = True
    shown: Callable[[Sequence[Row]], bool] = field(default=_always)
    section: str = "speed"  # which question's table shows it (SECTIONS); the combination is in every one
    parts: str | None = None  # what joins a cell's parts (a device each): index.html gives each its own line


def _percent(share: float | None) -> float | None:
    return share and 100 * share


def _mem_max(r: Row) -> str:
    """`1024 (1000–1100)`: the largest device's use, with its min-max over repeats where there are some."""
    found = memory(r)
    return fmt(found.max_mib, 0) + (f" ({fmt(found.max_lo, 0)}–{fmt(found.max_hi, 0)})" if found.max_lo is not None
                                    else "")


def _band(r: Row, end: int) -> float | None:
    band = prediction(r).predicted_peak_band
    return band[end] if band else None


def _loss_diff(r: Row) -> str:
    diff = r.parity.loss_diff if r.parity else None
    return "—" if diff is None else f"{diff:.1e}"


def _signed_pct(share: float | None) -> str:
    return "—" if share is None else f"{100 * share:+.1f} %"


def _predicted_peak(r: Row) -> str:
    """`13.3 [12.0–14.8]`: the planner's peak with its 90 % band."""
    band = prediction(r).predicted_peak_band
    return fmt(prediction(r).predicted_peak_mib, 1) + (_between(band[0], band[1], 1) if band else "")


def _between(lo: float | None, hi: float | None, digits: int, suffix: str = "") -> str:
    return f" [{fmt(lo, digits)}–{fmt(hi, digits)}{suffix}]" if lo is not None and hi is not None else ""


def _rate(rows: Sequence[Row]) -> str:
    """What the throughput counts: images, unless a row's samples are sequences or a workload of one's own."""
    return "img/s" if all(r.model_sample in (None, "images") for r in rows) else "samples/s"


def _with_tokens(rows: Sequence[Row]) -> bool:
    return any(r.tokens_per_sample for r in rows)


def _times_tokens(r: Row, samples_s: float | None) -> float | None:
    """A token model's samples/s as tokens/s (its interval scales alike: the sequence length is fixed)."""
    return samples_s * r.tokens_per_sample if samples_s is not None and r.tokens_per_sample else None


def _tokens_s(r: Row) -> str:
    if not r.tokens_per_sample:
        return "—"
    return fmt(_times_tokens(r, r.throughput), 0) + _interval_or_unknown(r, _times_tokens(r, r.throughput_lo),
                                                                         _times_tokens(r, r.throughput_hi), 0)


BUSY = "— (busy)"  # a figure a busy machine made: shown for what it is, never judged


def _time_error(r: Row) -> str:
    """A busy row's time was taken with others on the machine: its error says nothing about the prediction."""
    error = prediction(r).time_error
    return BUSY if r.busy and error is not None else _signed_pct(error)


def _interval_or_unknown(r: Row, lo: float | None, hi: float | None, digits: int) -> str:
    """The 95 % interval from the runs; why there is none; `busy` when every run was taken on a busy machine."""
    if r.throughput is None:
        return ""
    if r.busy:
        return " busy (no interval, not judged)"
    return _between(lo, hi, digits) if r.spread_known else " (spread unknown)"


def _plus_minus(r: Row) -> str:
    """The terminal's short interval: ± half its width, in % of the figure."""
    if r.throughput is None:
        return ""
    if r.busy:
        return " busy"
    if not r.spread_known or r.throughput_lo is None or r.throughput_hi is None:
        return "?"
    return f" ±{50 * (r.throughput_hi - r.throughput_lo) / r.throughput:.0f}%"


def _speedup(r: Row, digits: int = 2) -> str:
    if r.speedup is None:
        return "—"
    word = f" {r.speedup_word}" if r.speedup_word in ("faster", "slower", "equivalent") else ""
    return fmt(r.speedup, digits, "×") + interval_text(r.speedup_lo, r.speedup_hi, digits) + word


def _status(r: Row) -> str:
    status = r.status if not r.reason else f"{r.status}: {r.reason}"
    return status + (f" · stopped early after round {r.stopped_early}: slower by the rule" if r.stopped_early else "")


CUMULATIVE_SHOWN = 8  # edges the formatted table shows at most (evenly spread, the last always); csv has all


def _cumulative(rows: Sequence[Row]) -> list[Column]:
    """One column per window edge any row reached: the time at that iteration count, as in the original
    hand-made table (report.csv: every edge; the formatted table: CUMULATIVE_SHOWN of them at most)."""
    edges = sorted({it for r in rows for it, _ in r.cumulative})
    step = -(-len(edges) // CUMULATIVE_SHOWN) if edges else 1
    shown = set(edges[::-1][::step])
    return [Column(f"{it} it" if it in shown else None, lambda r, it=it: fmt(dict(r.cumulative).get(it), 1),
                   csv=((f"cumulative_s_at_{it}", lambda r, it=it: dict(r.cumulative).get(it)),),
                   section="cumulative") for it in edges]


def _runs(r: Row) -> str:
    """How many runs the row's figures rest on, and whether racing stopped it."""
    if not r.ok_runs:
        return "—"
    used = len(r.run_throughputs) if not r.busy else 0
    busy = f" (+{r.busy_runs} busy)" if r.busy_runs else ""
    return str(used or (0 if r.busy else r.ok_runs)) + busy + (f" (stopped r{r.stopped_early})" if r.stopped_early
                                                                 else "")


def devices_said(devices: Sequence[str]) -> str:
    """`cuda:0–7`: a row's devices with consecutive indices as a range, so that eight GPUs take one short cell;
    report.csv keeps each name."""
    groups: dict[str, list[int]] = {}
    said: list[str] = []
    for device in devices:
        kind, _, index = device.rpartition(":")
        if kind and index.isdigit():
            if kind not in groups:
                said.append(kind)
            groups.setdefault(kind, []).append(int(index))
        else:
            said.append(device)
    return ", ".join(f"{kind}:{_ranges(groups[kind])}" if kind in groups else kind for kind in said) or "—"


def _ranges(indices: Sequence[int]) -> str:
    """[0, 1, 2, 3, 5] -> `0–3,5`."""
    spans: list[list[int]] = []
    for i in sorted(set(indices)):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(f"{a}–{b}" if b > a + 1 else f"{a},{b}" if b > a else str(a) for a, b in spans)


def pids_said(pids: Sequence[int]) -> str:
    """The PID of the row's last run on a device, and how many other runs' PIDs there were (one per run)."""
    if not pids:
        return "no PID"
    return f"PID {max(pids)}" + (f" (+{len(pids) - 1} in other runs)" if len(pids) > 1 else "")


PART = " · "  # between the devices of a per-device cell


def _per_device(r: Row) -> str:
    return PART.join(f"{d.device} {fmt(d.used_mib, 0)} MiB, {pids_said(d.pids)}" for d in memory(r).per_device) or "—"


def _imbalance(r: Row) -> str:
    """Meaningful for devices only: CPU worker processes have no device memory to be out of balance."""
    if memory(r).source == "psutil":
        return "n/a"
    return fmt(memory(r).imbalance_pct, 0, "%")


def columns(rows: Sequence[Row]) -> list[Column]:
    """Every column of the report for these rows, in order (`shown` says which the formatted table leaves out)."""
    return [
        Column("combination", lambda r: r.label, csv=(("combination", lambda r: r.label),), terminal="combination",
               terminal_cell=lambda r: r.label, numeric=False, section="all"),
        Column(None, csv=(("strategy", lambda r: r.strategy), ("amp", lambda r: r.amp), ("model", lambda r: r.model),
                          ("variant", lambda r: r.variant))),
        Column("devices", lambda r: devices_said(r.devices),
               csv=(("devices", lambda r: " ".join(r.devices)), ("n_devices", lambda r: r.n_devices))),
        Column("procs", lambda r: str(r.processes or "—"), csv=(("processes", lambda r: r.processes),)),
        Column(None, csv=(("global_batch", lambda r: r.global_batch),)),
        Column("runs", _runs, terminal="runs", terminal_cell=_runs),
        Column(None, csv=(("runs", lambda r: r.runs), ("ok_runs", lambda r: r.ok_runs),
                          ("steady_windows", lambda r: r.steady_windows),
                          ("spread_known", lambda r: int(r.spread_known)))),
        Column(None, csv=(("rounds", lambda r: len(r.run_throughputs)), ("stopped_early_after_round", lambda r: r.stopped_early),
                          ("busy", lambda r: int(bool(r.busy))), ("busy_runs", lambda r: r.busy_runs))),
        Column(f"s/{PER} it [95 %]", lambda r: fmt(r.s_per_20, 3) + _interval_or_unknown(r, r.s_per_20_lo,
                                                                                       r.s_per_20_hi, 3),
               csv=(("s_per_20", lambda r: r.s_per_20), ("s_per_20_lo", lambda r: r.s_per_20_lo),
                    ("s_per_20_hi", lambda r: r.s_per_20_hi), ("s_per_20_window_p10", lambda r: r.s_per_20_p10),
                    ("s_per_20_window_p90", lambda r: r.s_per_20_p90)),
               terminal=f"s/{PER} it", terminal_cell=lambda r: fmt(r.s_per_20, 3), star="s_per_20"),
        *_cumulative(rows),
        Column(f"{_rate(rows)} [95 %]", lambda r: fmt(r.throughput, 1) + _interval_or_unknown(r, r.throughput_lo,
                                                                                            r.throughput_hi, 1),
               csv=(("img_s", lambda r: r.throughput), ("img_s_lo", lambda r: r.throughput_lo),
                    ("img_s_hi", lambda r: r.throughput_hi)),
               terminal=_rate(rows), terminal_cell=lambda r: fmt(r.throughput, 1) + _plus_minus(r), star="throughput"),
        Column("tok/s [95 %]", _tokens_s, shown=_with_tokens,
               csv=(("tokens_s", lambda r: _times_tokens(r, r.throughput)),
                    ("tokens_s_lo", lambda r: _times_tokens(r, r.throughput_lo)),
                    ("tokens_s_hi", lambda r: _times_tokens(r, r.throughput_hi))),
               terminal="tok/s", terminal_cell=lambda r: fmt(_times_tokens(r, r.throughput), 0)),
        Column("speedup [95 %]", _speedup,
               csv=(("speedup", lambda r: r.speedup), ("speedup_lo", lambda r: r.speedup_lo),
                    ("speedup_hi", lambda r: r.speedup_hi)),
               terminal="speedup", terminal_cell=lambda r: fmt(r.speedup, 2, "×")),
        Column("efficiency", lambda r: fmt(_percent(r.efficiency), 0, "%"),
               csv=(("efficiency", lambda r: r.efficiency),)),
        Column("final loss", lambda r: fmt(r.final_loss, 4), csv=(("final_loss", lambda r: r.final_loss),)),
        Column("mem max MiB", section="memory", cell=_mem_max,
               csv=(("mem_max_mib", lambda r: memory(r).max_mib), ("mem_max_lo_mib", lambda r: memory(r).max_lo),
                    ("mem_max_hi_mib", lambda r: memory(r).max_hi)),
               terminal="mem MiB", terminal_cell=lambda r: fmt(memory(r).max_mib, 0), star="mem_max_mib"),
        Column("mem min MiB", lambda r: fmt(memory(r).min_mib, 0), csv=(("mem_min_mib", lambda r: memory(r).min_mib),),
               section="memory"),
        # the one answer to "will it fit": the prediction with its band beside the measured peak of the same kind
        Column("predicted peak MiB [90 %]", _predicted_peak, section="memory",
               csv=(("predicted_peak_mib", lambda r: prediction(r).predicted_peak_mib),
                    ("predicted_peak_lo_mib", lambda r: _band(r, 0)), ("predicted_peak_hi_mib", lambda r: _band(r, 1))),
               terminal="predicted peak MiB", terminal_cell=lambda r: fmt(prediction(r).predicted_peak_mib, 1)),
        Column("measured peak MiB", lambda r: fmt(prediction(r).measured_peak_mib, 1), section="memory",
               csv=(("measured_peak_mib", lambda r: prediction(r).measured_peak_mib),),
               terminal="measured peak MiB", terminal_cell=lambda r: fmt(prediction(r).measured_peak_mib, 1)),
        Column("params/rank MiB", lambda r: fmt(memory(r).params_rank_mib, 2), section="memory",
               csv=(("params_rank_mib", lambda r: memory(r).params_rank_mib),),
               shown=lambda rows: any(memory(r).params_rank_mib is not None for r in rows)),
        # the older per-rank theory (parameters, gradients, optimizer state; no activations): report.csv only
        Column(None, None, csv=(("theory_mib", lambda r: memory(r).theory_mib),)),
        Column("imbalance", _imbalance, csv=(("mem_imbalance_pct", lambda r: memory(r).imbalance_pct),),
               section="memory"),
        Column("per device (PIDs)", _per_device, numeric=False, section="memory", parts=PART),
        Column("startup s", lambda r: fmt(STARTUP_S(r), 1), csv=(("startup_s", STARTUP_S),), section="time"),
        Column("compile s", lambda r: fmt(COMPILE_S(r), 1), csv=(("compile_s", COMPILE_S),), section="time"),
        Column("MFU", lambda r: fmt(_percent(MFU(r)), 1, "%"), csv=(("mfu", MFU),), section="time",
               shown=lambda rows: any(MFU(r) is not None for r in rows)),
        Column("data wait", lambda r: pct(DATA_WAIT(r)), csv=(("data_wait_share", DATA_WAIT),), section="time"),
        Column(f"profiled: {BREAKDOWN_HEAD}", breakdown_cell, section="time",
               csv=tuple((f"profiled_{part}_share", lambda r, part=part: profile(r).breakdown.get(part))
                         for part in BREAKDOWN_PARTS)),
        Column("comm overlapped", lambda r: pct(profile(r).comm_overlapped_share), section="time",
               csv=(("comm_overlapped_share", lambda r: profile(r).comm_overlapped_share),)),
        Column("J/image", lambda r: fmt(ENERGY(r), 3), section="time", csv=(("energy_j_per_image", ENERGY),)),
        # harness.prediction's prediction, made before the run, beside the measurement
        Column("memory error", lambda r: _signed_pct(prediction(r).peak_error), section="prediction",
               csv=(("peak_error", lambda r: prediction(r).peak_error),)),
        Column("predicted s/it", lambda r: fmt(prediction(r).predicted_s_per_it, 4), section="prediction",
               csv=(("predicted_s_per_it", lambda r: prediction(r).predicted_s_per_it),)),
        Column("measured s/it", lambda r: fmt(prediction(r).measured_s_per_it, 4), section="prediction",
               csv=(("measured_s_per_it", lambda r: prediction(r).measured_s_per_it),)),
        Column("time error", _time_error, section="prediction",  # a busy row's: not judged (report.csv: nan)
               csv=(("time_error", lambda r: None if r.busy else prediction(r).time_error),)),
        # numerical parity (parity=true): before the status; report.csv always has its columns
        Column("parity (max rel Δ)", lambda r: parity.cell(r.parity), shown=_with_parity, section="parity",
               csv=(("parity", lambda r: r.parity.verdict if r.parity else ""),
                    ("parity_reference", lambda r: r.parity and r.parity.reference or ""),
                    ("parity_max_abs", lambda r: r.parity and r.parity.max_abs),
                    ("parity_max_rel", lambda r: r.parity and r.parity.max_rel))),
        Column("max loss Δ", _loss_diff, shown=_with_parity, section="parity",
               csv=(("parity_loss_diff", lambda r: r.parity and r.parity.loss_diff),)),
        Column("status", _status, numeric=False, section="not_run",
               csv=(("status", lambda r: r.status), ("reason", lambda r: r.reason or "")),
               ),
    ]


# The report's questions, in order: (section, heading). A section none of whose cells says anything is left out.
SECTIONS = (("speed", "Speed: how fast is each combination?"),
            ("cumulative", "Over the iterations: time at each count (the original hand-made table), and loss"),
            ("memory", "Memory: how much on each device, and which process holds it?"),
            ("parity", "Numerical parity: does each combination train the same model?"),
            ("time", "Where the time goes"),
            ("prediction", "Predicted before each run, beside what it measured (error = (measured − predicted) / "
                           "measured)"))


def ran(rows: Sequence[Row]) -> list[Row]:
    """The rows the sections' tables hold: those with a run that finished (the rest are listed, not tabled)."""
    return [r for r in rows if r.ok_runs]


def section_table(rows: Sequence[Row], section: str) -> tuple[list[Column], list[list[str]]]:
    """One section's table for the rows that ran: the combination, then the section's columns that say
    something for at least one row (an all-"—" column is left out); no columns beyond the name: empty."""
    body_rows = ran(rows)
    picked = [c for c in columns(rows) if c.header is not None and c.section == section and c.shown(rows) and c.cell
              and any(c.cell(r) not in ("—", "", "n/a") for r in body_rows)]
    if not picked or not body_rows:
        return [], []
    name = columns(rows)[0]
    shown = [name, *picked]
    return shown, [[c.cell(r) if c.cell else "" for c in shown] for r in body_rows]


def not_run(rows: Sequence[Row]) -> list[tuple[str, str, list[str]]]:
    """(status, reason, labels) for every row some run of which did not finish, grouped by reason."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.status != "ok":
            groups.setdefault((r.status.split(" ")[0] if not r.ok_runs else r.status, r.reason or "no reason recorded"),
                              []).append(r.label)
    return [(status, reason, labels) for (status, reason), labels in groups.items()]


def table(rows: Sequence[Row]) -> tuple[list[Column], list[list[str]]]:
    """report.md's and index.html's table: its columns and each row's formatted cells."""
    shown = [c for c in columns(rows) if c.header is not None and c.shown(rows)]
    return shown, [[c.cell(r) if c.cell else "" for c in shown] for r in rows]


def csv_table(rows: Sequence[Row]) -> tuple[list[str], list[list[Any]]]:
    """report.csv: every column's plain values, whether or not the formatted table shows it."""
    pairs = [pair for c in columns(rows) for pair in c.csv]
    return [name for name, _ in pairs], [[get(r) for _, get in pairs] for r in rows]
