"""The report's rows: every results.json under some folders, grouped into one row per combination (repeats
pooled), with the figures a reader compares and which of them win beyond the run-to-run spread."""

from __future__ import annotations

import json
import logging
import math
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.errors import ConfigError
from harness.core.results import RESULTS_NAME, RunRecord, WindowRecord, from_dict, load_results
from harness.memory import report as memory_report
from harness.memory.report import MemorySection
from harness.parity import report as parity
from harness.parity.report import ParitySection
from harness.prediction import report as plan_report
from harness.prediction.report import PredictionSection
from harness.profile import report as profile_report
from harness.profile.report import ProfileSection
from harness.verdict.intervals import Fit, Observation
from harness.verdict.rule import Design

PER = 20  # the user's unit: seconds per 20 iterations
log = logging.getLogger(__name__)


@dataclass
class Row:
    """One combination, its repeats pooled: what the report's rows compare. A figure of each run that only a
    column shows is pooled by that column (`median`); the features' figures are their own sections."""

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
    s_per_20: float | None = None  # each run's median steady window, per PER iterations; geometric mean over runs
    tokens_per_sample: int | None = None  # a token model's sequence length (tokens/s = samples/s x this)
    model_sample: str | None = None  # what one sample is: images, tokens, samples (a workload of one's own)
    s_per_20_lo: float | None = None  # its 95 % interval, from the runs (harness.verdict.intervals)
    s_per_20_hi: float | None = None
    s_per_20_p10: float | None = None  # p10-p90 of the steady windows, all runs pooled (within a process)
    s_per_20_p90: float | None = None
    steady_windows: int = 0
    cumulative: list[tuple[int, float]] = field(default_factory=list)  # (iteration, median seconds)
    throughput: float | None = None  # geometric mean over runs (quiet runs only, where there are any)
    run_rates: list[float] = field(default_factory=list)  # each ok run's throughput (the unit that varies)
    run_throughputs: list[tuple[int | None, float]] = field(default_factory=list)  # (round, img/s) of its quiet runs
    run_s_per_20: list[tuple[int | None, float]] = field(default_factory=list)  # (round, median window) of the same
    run_places: dict[int, int] = field(default_factory=dict)  # round -> its run's place in the round, where known
    throughput_lo: float | None = None  # 95 % interval from the runs (None: unknown, one run in the sweep)
    throughput_hi: float | None = None
    spread_known: bool = False  # the row has an interval from its runs (a busy row never has one)
    busy: str | None = None  # every run of the row was measured while the machine was busy: why; not judged
    busy_runs: int = 0  # runs left out because the machine was busy while they were timed
    stopped_early: int | None = None  # racing stopped it after this round (the rule found it slower)
    speedup: float | None = None  # over the baseline, paired by round, with its interval
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    speedup_word: str | None = None  # the rule's word: faster, slower, equivalent or undecided
    efficiency: float | None = None  # multi-device rows: speedup over the one-device row at this amp / devices
    losses: list[tuple[int, float]] = field(default_factory=list)
    final_loss: float | None = None
    variant: str = ""  # strategy options, compile, grad_accum that set this row apart (in its label)
    overrides: list[str] = field(default_factory=list)  # the command line's overrides of the row's first run
    # each feature's section, pooled over the repeats by the feature itself (None: no run of the row has it)
    memory: MemorySection | None = None  # harness.memory.report
    profile: ProfileSection | None = None  # harness.profile.report (profile=true)
    prediction: PredictionSection | None = None  # harness.prediction.report: the prediction beside what was measured
    parity: ParitySection | None = None  # harness.parity.report (parity=true)
    # what a projection needs of the row (`--project`): its first finished run's resolved config and batch share
    config: dict[str, Any] = field(default_factory=dict, repr=False)
    local_batch: int | None = None
    records: tuple[RunRecord, ...] = field(default=(), repr=False)  # its finished runs: what `median` pools

    @property
    def n_devices(self) -> int:
        return max(1, len(self.devices))

    def median(self, figure: Callable[[RunRecord], float | None]) -> float | None:
        """A figure each finished run measured, pooled over the repeats: the median of the runs that have it. A
        column reads a run's figure through this, so that a figure added to RunRecord needs no field here."""
        known = [value for run in self.records if (value := figure(run)) is not None]
        return statistics.median(known) if known else None

    def as_json(self) -> dict[str, Any]:
        """report.json's row: every field but the runs' records (each run's results.json holds its own)."""
        return {k: v for k, v in asdict(replace(self, records=())).items() if k != "records"}


def find_results(paths: Iterable[Path]) -> tuple[list[tuple[Path, RunRecord]], list[str]]:
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


@dataclass(frozen=True)
class Combination:
    """What makes runs one row: runs with equal combinations are repeats of each other and pooled."""

    strategy: str
    amp: str
    impl: str | None
    dtype: str | None
    model: str
    devices: tuple[str, ...]
    global_batch: int | None
    image_size: int | None
    iterations: int | str | None  # as asked for: a number or "auto"
    launcher: str | None
    variant: str  # the strategy's own short word on its options, compile, grad_accum: always in the label
    options: tuple[str, ...]  # the strategy's and the model's options: in the label when peers differ in them
    settings: tuple[tuple[str, str], ...]  # the rest of the resolved config (`optim.lr`, `data.name`, ...)
    tokens_per_sample: int | None = None  # a token model's sequence length: part of the work, as the image size

    @classmethod
    def of(cls, results: RunRecord) -> Combination:
        precision = results.precision
        return cls(results.strategy, results.amp, precision.impl if precision else None,
                   precision.dtype if precision else None, results.model, tuple(results.devices),
                   results.global_batch, results.image_size,
                   results.iterations_requested if results.iterations_requested is not None else results.iterations,
                   results.launcher, results.variant, _options(results), _settings(results.config),
                   results.tokens_per_sample)

    def peer_of(self, other: Combination) -> bool:
        """The same strategy at the same amp level: what labels tell apart."""
        return (self.strategy, self.amp) == (other.strategy, other.amp)

    def same_work(self, other: Combination) -> bool:
        """The same model, batch and image size at the same amp level (implementation and dtype): what a
        multi-device row's efficiency is measured against, whatever the strategy and devices."""
        return ((self.amp, self.impl, self.dtype, self.model, self.global_batch, self.image_size,
                 self.tokens_per_sample)
                == (other.amp, other.impl, other.dtype, other.model, other.global_batch, other.image_size,
                    other.tokens_per_sample))


# The fields a label may name when a row's peers differ in them, with the word it uses.
LABELLED = {"impl": "impl", "dtype": "dtype", "model": "model", "devices": "devices", "global_batch": "batch",
            "image_size": "px", "iterations": "it", "launcher": "launcher", "options": ""}


# Config keys a row's label names through a field of its own (or that only steer the report, the repeats or the
# predictions made before a run, which change nothing it measures): the rest of the resolved config tells rows
# apart too, so that no swept axis is pooled into a mean.
NAMED_ELSEWHERE = ("strategy", "model", "amp.level", "amp.impl", "amp.dtype", "amp._target_", "batch_size",
                   "data.image_size", "iterations", "launcher", "gpus", "nprocs", "compile", "grad_accum", "repeat",
                   "round", "place", "after", "timing.budget_s", "report", "verdict", "plan")


def _settings(config: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The resolved config, flattened to `group.key` = value (JSON text), less what NAMED_ELSEWHERE covers."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        elif not any(prefix == n or prefix.startswith(n + ".") for n in NAMED_ELSEWHERE):
            flat[prefix] = json.dumps(value, sort_keys=True, default=str)

    walk("", config)
    return tuple(sorted(flat.items()))


def _options(results: RunRecord) -> tuple[str, ...]:
    """The strategy's and the model's own options (`model.norm=none`): runs that differ in them are different
    rows (and a label names what differs)."""
    config = results.config
    strategy = sorted((config.get("strategy") or {}).items())  # its _target_ too: a plugin under a known name
    model = sorted((k, v) for k, v in (config.get("model") or {}).items() if k not in ("_target_", "name"))
    return tuple(f"strategy.{k}={v}" for k, v in strategy) + tuple(f"model.{k}={v}" for k, v in model)


def _label(key: Combination, varying: set[str], common: frozenset[str] = frozenset(),
           said: frozenset[str] = frozenset(), overrides: Sequence[str] = ()) -> str:
    """`said`: option names its peers' variants spell short (`comm_hook=fp16`): this row's value of the same
    option is spelled the same way (`comm_hook=none`, not `strategy.comm_hook=none`). Settings that vary
    among its peers are named as the command line chose them (`optim=adamw`), else as `key=value`."""
    parts = key.variant.split() if key.variant else []
    parts += _setting_words(key, {n.removeprefix("setting:") for n in varying if n.startswith("setting:")}, overrides)
    for name in (n for n in LABELLED if n in varying):
        if name == "options":  # options: only those its peers do not all share, and not said by the variant
            parts += [_short(o, said) for o in key.options if o not in common
                      and o.partition("=")[0].rpartition(".")[2] + "=" not in key.variant]
            continue
        value = getattr(key, name)
        parts.append(f"{LABELLED[name]}={','.join(value) if name == 'devices' else value}")
    # one fixed order in every label, whichever part of the config said what: by the option's name
    return " ".join([f"{key.strategy} {key.amp}", *sorted(dict.fromkeys(parts), key=lambda w: w.partition("=")[0])])


def _setting_words(key: Combination, names: set[str], overrides: Sequence[str]) -> list[str]:
    """`optim=adamw` when the command line chose the group (`optim=adamw` among the overrides), else each
    varying setting as `optim.lr=0.01` (missing: `optim.lr=none`)."""
    chosen = {o.partition("=")[0].lstrip("+~"): o.lstrip("+~") for o in overrides if "=" in o}
    own = dict(key.settings)
    words: list[str] = []
    for name in sorted(names):
        group = name.partition(".")[0]
        if group in chosen and "." not in chosen[group].partition("=")[0]:
            word = chosen[group]
        else:
            value = own.get(name)
            word = f"{name}={'none' if value is None else json.loads(value)}"
        if word not in words:
            words.append(word)
    return words


def _short(option: str, said: frozenset[str]) -> str:
    option = option.replace("._target_=", "=")
    name = option.partition("=")[0]
    return option.removeprefix("strategy.") if name.removeprefix("strategy.") in said else option


def _said(key: Combination, keys: Sequence[Combination]) -> frozenset[str]:
    """The option names the variants of this row's peers (same strategy and amp level) spell out."""
    return frozenset(part.partition("=")[0] for k in keys if k.peer_of(key) for part in k.variant.split()
                     if "=" in part)


def _known(value: Any) -> bool:
    """A combination that never ran (refused, skipped) did not learn its devices or precision: unknown values
    neither differ from its peers' nor go into its label."""
    return value not in (None, ())


def _varying(keys: Sequence[Combination]) -> dict[Combination, set[str]]:
    """Fields that tell apart rows sharing a strategy and amp level (only those go into a label)."""
    result = {}
    for key in keys:
        peers = [k for k in keys if k.peer_of(key)]
        result[key] = {name for name in LABELLED if _known(getattr(key, name))
                       and len({getattr(k, name) for k in peers if _known(getattr(k, name))}) > 1}
        if key.settings:  # a combination that never ran still has its config: its settings tell it apart
            names = {n for k in peers if k.settings for n, _ in k.settings}
            result[key] |= {f"setting:{n}" for n in names
                            if len({dict(k.settings).get(n) for k in peers if k.settings}) > 1}
    return result


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _row(group: list[RunRecord], label: str, sweep_of: Mapping[int, int] | None = None) -> Row:
    """`sweep_of`: id(run) -> the index of its sweep among the folders read (rounds pair within a sweep only)."""

    def sweep_round(run: RunRecord) -> int | None:
        return None if run.round is None else (sweep_of or {}).get(id(run), 0) * SWEEP_STRIDE + run.round

    first = group[0]
    ok = [r for r in group if r.status == "ok"]
    statuses = sorted({r.status for r in group})
    status = statuses[0] if len(statuses) == 1 else "/".join(f"{s} {sum(r.status == s for r in group)}" for s in statuses)
    reasons = [r.error for r in group if r.error]
    row = Row(label=label, strategy=first.strategy, amp=first.amp, model=first.model, devices=list(first.devices),
              processes=_median_int([_rank_pids(r) for r in (ok or group)]), global_batch=first.global_batch,
              status=status, reason=reasons[0] if reasons else None, runs=len(group), ok_runs=len(ok),
              variant=first.variant, overrides=list(first.overrides))
    if not ok:
        return row

    steady = [w.seconds * PER / (r.log_every or 1) for r in ok for w in r.windows if _steady(w)]
    row.steady_windows = len(steady)
    if steady:
        row.s_per_20 = statistics.median(steady)  # until the runs' figure replaces it (apply_intervals)
        row.s_per_20_p10, row.s_per_20_p90 = percentile(steady, 10), percentile(steady, 90)
    edges: dict[int, list[float]] = {}
    losses: dict[int, list[float]] = {}
    for r in ok:
        for w in r.windows:
            edges.setdefault(w.end_iter, []).append(w.cumulative_seconds)
            if w.loss is not None:
                losses.setdefault(w.end_iter, []).append(w.loss)
    row.cumulative = [(it, statistics.median(v)) for it, v in sorted(edges.items()) if len(v) == len(ok)]
    row.losses = [(it, statistics.median(v)) for it, v in sorted(losses.items())]
    row.final_loss = row.losses[-1][1] if row.losses else None

    row.tokens_per_sample = next((r.tokens_per_sample for r in ok if r.tokens_per_sample), None)
    row.model_sample = next((r.sample for r in ok if r.sample), None)
    timed = [r for r in ok if r.timed]
    row.run_rates = [r.throughput_img_s for r in timed if r.throughput_img_s]
    quiet = [r for r in timed if r.quiet]
    row.busy_runs = len(timed) - len(quiet)
    if timed and not quiet:  # shown for what it is: its runs' own figure, no interval, not judged
        row.busy = next(r.machine.reason for r in timed if r.machine) or "the machine was busy"
        row.throughput = math.exp(statistics.fmean(math.log(v) for v in row.run_rates))
        row.s_per_20 = math.exp(statistics.fmean(math.log(_median_window(r)) for r in timed))
    row.run_throughputs = [(sweep_round(r), r.throughput_img_s) for r in quiet if r.throughput_img_s]
    row.run_s_per_20 = [(sweep_round(r), _median_window(r)) for r in quiet]
    row.run_places = {n: r.place for r in quiet if r.place is not None and (n := sweep_round(r)) is not None}
    row.config, row.local_batch, row.records = ok[0].config, ok[0].local_batch, tuple(ok)
    # each feature's section, pooled over the repeats by the feature itself
    row.memory, row.profile = memory_report.section(ok), profile_report.section(ok)
    row.prediction = plan_report.section(ok)
    return row


def measured_beside_predicted(row: Row) -> None:
    """The prediction section's measured time is the speed table's (its s per PER iterations, the runs' level),
    not a second figure for the same question (each run's mean over its steady windows, in results.json)."""
    if row.prediction is not None:
        row.prediction = plan_report.beside(row.prediction, row.s_per_20 / PER if row.s_per_20 is not None else None)


def _steady(window: WindowRecord) -> bool:
    return not window.warmup and not window.profiled


def _median_window(run: RunRecord) -> float:
    return statistics.median(w.seconds * PER / (run.log_every or 1) for w in run.windows if _steady(w))


SWEEP_STRIDE = 100_000  # rounds of different sweeps merged into one report are numbered apart: never paired


def sweep_folder(path: Path) -> Path:
    """The sweep a results.json belongs to: `<sweep>/<job>/` or `<sweep>/round-N/<job>/` (a single run: its own)."""
    job = path.parent
    parent = job.parent
    return parent.parent if parent.name.startswith("round-") else parent


def _rank_pids(results: RunRecord) -> int:
    return len({(p.node, p.pid) for p in results.memory.per_process if p.role == "rank"})


def _median_int(values: Sequence[int]) -> int | None:
    values = [v for v in values if v]
    return int(statistics.median_low(values)) if values else None


@dataclass(frozen=True)
class RowSet:
    """The rows with the baseline of their speedups and the fit their levels came from: the verdict decides on
    this same fit (harness.report.findings hands it on), never on one built again."""

    rows: list[Row]
    baseline: str | None
    fit: Fit


def row_set(found: Sequence[tuple[Path, RunRecord | dict[str, Any]]], baseline: str | None = None,
            strict: bool = False, planned: int | None = None) -> RowSet:
    """`strict`: a baseline that matches no row that ran is a ConfigError (the report command's --baseline);
    else a warning, and the default baseline (a sweep's report.baseline may name a row that was skipped).
    `planned`: the rounds a racing sweep planned (its rounds.json), for the levels of its looks."""
    groups: dict[Combination, list[RunRecord]] = {}
    folders: dict[Combination, list[Path]] = {}
    sweeps: dict[Path, int] = {}
    sweep_of: dict[int, int] = {}
    for path, loaded in found:
        results = loaded if isinstance(loaded, RunRecord) else from_dict(loaded)
        groups.setdefault(Combination.of(results), []).append(results)
        folders.setdefault(Combination.of(results), []).append(path.parent)
        sweep_of[id(results)] = sweeps.setdefault(sweep_folder(path), len(sweeps))
    varying = _varying(list(groups))
    keys = list(groups)
    rows = [_row(groups[k], _label(k, varying[k], _common_options(k, keys), _said(k, keys), groups[k][0].overrides),
                 sweep_of) for k in keys]
    found_parity = parity.sections([r.label for r in rows], [
        [parity.Run(r, f) for r, f in zip(groups[k], folders[k], strict=True) if r.status == "ok"] for k in keys])
    for row, section in zip(rows, found_parity, strict=True):
        row.parity = section
    fit = apply_intervals(rows, planned)
    base = _pick_baseline(rows, baseline, strict)
    if base is not None and base.throughput and not base.busy:
        for row in judged(rows):
            compared = fit.compare(row.label, base.label)
            if compared is not None:
                row.speedup, row.speedup_lo, row.speedup_hi = compared.ratio, compared.lo, compared.hi
                row.speedup_word = compared.word if row is not base else None
    for key, row in zip(keys, rows, strict=True):
        reference = _one_device_reference(key, row, keys, rows)
        if row.throughput and not row.busy and reference is not None and reference.throughput and not reference.busy:
            row.efficiency = row.throughput / (reference.throughput * row.n_devices)
    return RowSet(rows, base.label if base else None, fit)


def build_rows(found: Sequence[tuple[Path, RunRecord | dict[str, Any]]], baseline: str | None = None,
               strict: bool = False, planned: int | None = None) -> tuple[list[Row], str | None]:
    """The rows and their baseline's label, for a reader that needs no verdict (row_set keeps the fit too)."""
    built = row_set(found, baseline, strict, planned)
    return built.rows, built.baseline


def judged(rows: Sequence[Row]) -> list[Row]:
    """The rows a verdict may rest on: ok, timed, measured (at least once) on a quiet machine."""
    return [r for r in rows if r.run_throughputs and not r.busy]


def sweep_design(rows: Sequence[Row], planned: int | None = None) -> Design:
    """How the rule judges this report's pairs: the family every pair of its judged rows; a racing sweep's last
    look after the rounds it ran, its looks before as racing planned them (`planned`; unknown: the most racing
    ever plans, whose earlier looks are the strictest, so the report claims nothing racing's alpha did not
    cover: docs/verdict.md); a sweep of exactly `repeat=N` rounds, one look. verdict.margin as the runs had it."""
    from harness.verdict.rounds import MAX_PLANNED_ROUNDS

    rows = judged(rows)
    margins = {(r.config.get("verdict") or {}).get("margin") for r in rows} - {None}
    margin = float(min(margins)) if margins else Design().margin
    racing = any(r.config.get("repeat") is None and any(n is not None for n, _ in r.run_throughputs) for r in rows)
    rounds = [n % SWEEP_STRIDE for r in rows for n, _ in r.run_throughputs if n is not None]
    if not racing or not rounds:
        return Design(pairs=Design.family(len(rows)), margin=margin)
    return Design(pairs=Design.family(len(rows)), planned_rounds=planned or MAX_PLANNED_ROUNDS, margin=margin,
                  last_look=max(rounds))


def work_per_sample(rows: Sequence[Row]) -> dict[str, int]:
    """The unit the judged rows are compared in: where their samples hold different numbers of tokens (a swept
    model.seq_len) each row's tokens per sample, so that they are ranked and judged in tokens/s; otherwise
    nothing (samples/s, one sample alike in every row)."""
    tokens = {r.label: r.tokens_per_sample for r in judged(rows)}
    if len(set(tokens.values())) > 1 and all(tokens.values()):
        return {label: int(t or 1) for label, t in tokens.items()}
    return {}


def row_fit(rows: Sequence[Row], figure: str = "run_throughputs", planned: int | None = None) -> Fit:
    """The judged rows' quiet runs as harness.verdict fits them (a busy row's runs never enter), each with its
    place in its round. `figure`: `run_throughputs` (in tokens/s where the rows' samples differ in tokens:
    `work_per_sample`) or `run_s_per_20` (each run's median window)."""
    per = work_per_sample(rows) if figure == "run_throughputs" else {}
    return Fit((Observation(r.label, round_, value * per.get(r.label, 1),
                            r.run_places.get(round_) if round_ is not None else None)
                for r in judged(rows) for round_, value in getattr(r, figure)), sweep_design(rows, planned))


def apply_intervals(rows: Sequence[Row], planned: int | None = None) -> Fit:
    """Each judged row's throughput and time per PER iterations: its level in the round-adjusted fit, with a
    95 % interval from the runs (rounds), never from the windows of one process. A busy row keeps its own
    runs' geometric mean, without an interval."""
    fit, times = row_fit(rows, planned=planned), row_fit(rows, "run_s_per_20", planned)
    per = work_per_sample(rows)
    for row in judged(rows):
        level, time_level = fit.level(row.label), times.level(row.label)
        if level is None:
            continue
        unit = per.get(row.label, 1)  # the row's own figure stays per sample
        row.throughput = level.point / unit
        row.throughput_lo, row.throughput_hi = (level.lo / unit, level.hi / unit) if level.known else (None, None)
        row.spread_known = level.known
        if time_level is not None:
            row.s_per_20, row.s_per_20_lo, row.s_per_20_hi = time_level.point, time_level.lo, time_level.hi
    for row in rows:
        measured_beside_predicted(row)
    return fit


def _common_options(key: Combination, keys: Sequence[Combination]) -> frozenset[str]:
    """The options every row with this strategy and amp level shares (left out of its label)."""
    peers = [set(k.options) for k in keys if k.peer_of(key)]
    return frozenset(set.intersection(*peers)) if peers else frozenset()


def _one_device_reference(key: Combination, row: Row, keys: Sequence[Combination],
                          rows: Sequence[Row]) -> Row | None:
    """What a multi-device row's efficiency is measured against: the one-device run of the same model, batch,
    image size and amp level (`single` first). One-device rows have no efficiency: there is nothing to scale."""
    if row.n_devices < 2:
        return None
    same = [r for k, r in zip(keys, rows, strict=True)
            if r.n_devices == 1 and r.throughput and k.same_work(key)]
    same.sort(key=lambda r: r.strategy != "single")
    return same[0] if same else None


def _pick_baseline(rows: Sequence[Row], wanted: str | None, strict: bool = False) -> Row | None:
    ok = [r for r in rows if r.throughput]
    if wanted:
        strategy, _, amp = wanted.partition(":")
        match = [r for r in ok if r.strategy == strategy and (not amp or r.amp == amp)]
        if match:
            return match[0]
        ran = sorted({f"{r.strategy}:{r.amp}" for r in ok})
        if strict:
            raise ConfigError("--baseline", wanted, "a strategy:amp that ran here: " + (", ".join(ran) or "none ran"))
        log.warning("baseline %s has no row that ran; speedups are against the default baseline", wanted)
    single = [r for r in ok if r.strategy == "single" and r.amp == "O0" and r.n_devices == 1]
    return (single or ok or [None])[0]


@dataclass
class Context:
    """What a reader needs to trust the figures: when, on what, with which versions, by which command."""

    runs: int
    first_started: float | None
    last_finished: float | None
    machine: str
    versions: str
    commands: list[str]
    commits: list[str]
    kernels: str = ""  # cudnn.benchmark, channels_last, matmul precision as the runs had them


def context(found: Sequence[tuple[Path, RunRecord]]) -> Context:
    envs = [r.env for _, r in found]
    env = next((e for e in envs if e.torch or e.cpu), envs[0] if envs else None)
    gpus = env.gpu_names if env else []
    if gpus:
        names = sorted(set(gpus))
        machine = ", ".join(f"{gpus.count(n)}× {n}" for n in names) + f" (driver {env.driver if env else None})"
    else:
        machine = "no GPU"
    if env and env.cpu:
        machine = f"{env.cpu} ({env.cpu_capability or '?'}), " + machine
    versions = ", ".join(f"{k} {getattr(env, k)}" for k in ("torch", "python") if env and getattr(env, k))
    if env and env.torch_built_for_cuda:
        versions += f", torch built for CUDA {env.torch_built_for_cuda}"
    started = [r.started_at for _, r in found if r.started_at]
    finished = [r.finished_at for _, r in found if r.finished_at]
    return Context(runs=len(found), first_started=min(started) if started else None,
                   last_finished=max(finished) if finished else None, machine=machine, versions=versions,
                   commands=sorted({e.command for e in envs if e.command}),
                   commits=sorted({e.harness_commit for e in envs if e.harness_commit}),
                   kernels="; ".join(sorted({r.kernels.words() for _, r in found if r.kernels})) or "not recorded")
