"""`python run.py plan=true ... plan.hardware=<preset>` (and with -m): every combination predicted on a
preset, nothing trained. Each combination is placed on the preset's devices as it would be there, refused
or skipped for the reasons a run would be, and predicted (harness.prediction); plan.json and the tables land in
runs/plan/<time>/. Bad input (an unknown preset, a preset missing a field) is one line, exit 2, nothing
written. Also measures this machine's link for the `local` preset when it is needed and not yet cached."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.core.config import RunConfig
from harness.core.results import PlanRow, PredictionRecord
from harness.prediction.hardware import LINK_STATISTIC, LOCAL, load_preset
from harness.prediction.links import Link, fit_links
from harness.prediction.targets import local_target

log = logging.getLogger(__name__)
PLAN_DIR = Path("runs") / "plan"
LINK_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
LINK_SIZES = ["4KiB", "16KiB", "64KiB", "256KiB", "512KiB", "1MiB", "4MiB", "16MiB"]
LINK_DTYPES = ("float32", "bfloat16")
# the collectives table's column for a statistic
CALL_COLUMN = {"mean by size, after compute": "time_us_mean", "mean by size": "time_us_mean", "median": "time_us"}
AFTER_COMPUTE_MS = [1, 2, 4, 8]  # the compute before a call, as a step's calls have between them here
AFTER_COMPUTE_SIZE = "64KiB"  # what a call adds after compute does not depend on its size (link_after_compute.md)


def measure_link(nprocs: int, repeats: int) -> tuple[Link, dict[str, Link]]:
    """This machine's link: the collectives benchmark over `nprocs` workers, `repeats` calls a size
    (plan.link_repeats), fitted (harness.prediction.links) to each size's mean call (LINK_STATISTIC), not its
    median: a step pays every call it makes, and gloo's calls here are bimodal (a 512 KiB all-reduce between two
    ranks took 0.25 ms or 3.5-4 ms, the median 0.25 in one round of 60 and 3.5 in the next, the mean 1.4-2.3 ms in
    both); fitted to medians, every two-process case of benchmark 15 was predicted 12-50 % fast, the more so the
    more calls its step makes (FSDP, ZeRO, TP, the pipeline's sends). Each op's link keeps its sizes' means too,
    which price the calls between them (Link.measured_seconds), and what a call adds right after compute
    (`after_compute_costs`)."""
    import tempfile

    from harness.collectives import run_benchmark

    log.info("plan: measuring this machine's link once (collectives benchmark, %d workers; cached)", nprocs)
    quiet = logging.getLogger("harness.collectives.runner")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # its table is the benchmark's output, not the plan's
    pooled, links, costs = None, {}, {}
    try:
        for dtype in LINK_DTYPES:  # float32, and bfloat16: gloo reduces half types far slower
            # what a call adds after compute: timed in float32's launch, at one size (it depends on neither)
            after = {"after_compute_ms": AFTER_COMPUTE_MS, "after_compute_at": AFTER_COMPUTE_SIZE} \
                if dtype == "float32" else {}
            with tempfile.TemporaryDirectory(prefix="harness-link-") as folder:
                results = run_benchmark({"nprocs": nprocs, "gpus": None,
                                         "dist": {"timeout_s": 60, "start_timeout_s": 120},
                                         "collectives": {"ops": list(LINK_OPS), "sizes": LINK_SIZES, "warmup": 3,
                                                         "repeats": repeats, "dtype": dtype, **after}}, Path(folder))
            if results["status"] != "ok":
                raise RuntimeError(f"the collectives benchmark failed: {results['error']}")
            if after:
                costs = after_compute_costs(results["raw"])
            column = CALL_COLUMN[LINK_STATISTIC]  # the statistic the cache records, so changing it measures again
            samples = [(row["op"], row["size_bytes"], row[column] * 1e-6) for row in results["rows"]]
            fit, each = fit_links(samples, results["world_size"])
            pooled = pooled or fit
            for op, one in each.items():
                log.info("plan: %s in %s fitted: %.1f us per hop, %.2f GB/s bus bandwidth (R^2 %.3f over %d sizes)",
                         op, dtype, one.link.latency_us, one.link.bandwidth_gbps, one.r_squared, one.points)
                sizes = monotone(sorted((size, seconds) for name, size, seconds in samples if name == op))
                links[op if dtype == "float32" else f"{op}:{dtype}"] = replace(one.link, sizes=sizes,
                                                                               ranks=results["world_size"])
    finally:
        quiet.setLevel(level)
    assert pooled is not None
    return pooled.link, {key: replace(link, after_compute=costs.get(key.split(":")[0], ()))
                         for key, link in links.items()}


def after_compute_costs(raw: Sequence[Mapping[str, Any]]) -> dict[str, tuple[tuple[float, float], ...]]:
    """Each op's added seconds for a call made after 1-8 ms of compute (AFTER_COMPUTE_MS), from the collectives
    benchmark's raw rows timed after compute too (at AFTER_COMPUTE_SIZE): its mean over the ranks after compute
    (collectives.after_compute_ms) less the slowest rank's mean after a barrier, as the size table measures it; none
    below nothing, no less after a longer gap (isotonic). On this VM a call after 2 ms of compute took 0.2-0.7 ms
    more, after 4 ms 0.6-1.0 ms, back to back none more, whatever the op and size (benchmarks/
    link_after_compute.md): gloo's calls in a step cost more than the same calls timed after a barrier, and FSDP's
    and TP's steps make 15-60 of them."""
    import statistics

    costs = {}
    for row in (r for r in raw if "after_compute" in r):
        barrier = statistics.fmean(row["seconds"])
        gaps = sorted((float(gap) * 1e-3, max(0.0, statistics.fmean(times) - barrier))
                      for gap, times in row["after_compute"].items())
        costs[row["op"]] = monotone(gaps)
        log.info("plan: %s after compute adds %s", row["op"],
                 ", ".join(f"{added * 1e3:.2f} ms after {gap * 1e3:g} ms" for gap, added in costs[row["op"]]))
    return costs


def monotone(sizes: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Each size's mean call, ascending in size, made no shorter than a smaller size's (isotonic regression: where
    the noise of a hundred bimodal calls put a larger size below a smaller one, the two are pooled to their mean):
    a larger message does not cost less, and the table prices calls between its sizes."""
    from scipy.optimize import isotonic_regression  # a link measurement only

    pooled = isotonic_regression([seconds for _, seconds in sizes]).x
    return tuple((size, float(seconds)) for (size, _), seconds in zip(sizes, pooled, strict=True))


@contextlib.contextmanager
def plan_folder() -> Iterator[Path]:
    """runs/plan/<time>/, this process's log copied to its plan.log; on the way out the calibration's child is
    stopped and the log handler removed (plan=true's and a search on a preset's)."""
    from harness.core.logs import add_file, setup_cli
    from harness.prediction.calibrate import shutdown

    setup_cli()
    out = PLAN_DIR / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=False)
    handler = add_file(out / "plan.log")
    try:
        yield out
    finally:
        shutdown()
        logging.getLogger().removeHandler(handler)
        handler.close()


def plan_command(configs: Sequence[tuple[Sequence[str], RunConfig]]) -> int:
    """Predict every combination (its overrides, its composed config); 0 when all were predicted or skipped for
    a reason; ConfigError (exit 2 for the caller) on bad input, before anything is written."""
    from harness.launch.on_preset import predict_on
    from harness.launch.placement import usable_cores

    check_plan_presets([cfg for _, cfg in configs])  # before anything is measured or written
    rows: list[PlanRow] = []
    started = time.perf_counter()
    with plan_folder() as out:
        log.info("plan: %d combination(s) to predict on %s", len(configs),
                 ", ".join(dict.fromkeys(cfg.plan.hardware for _, cfg in configs)))
        for index, (combo, cfg) in enumerate(configs, start=1):
            begun = time.perf_counter()
            row = replace(PlanRow.from_json(predict_on(cfg, cfg.plan.hardware, usable_cores(), measure_link)),
                          overrides=list(combo), **sample_unit(cfg))
            row = replace(row, seconds=round(time.perf_counter() - begun, 2))
            left = (time.perf_counter() - started) / index * (len(configs) - index)
            log.info("plan: %d/%d %s: %s (%.1f s%s)", index, len(configs), row.label, row.status, row.seconds,
                     f"; about {left:.0f} s left" if index < len(configs) else "")
            rows.append(row)
        (out / "plan.json").write_text(json.dumps({"kind": "plan", "rows": [r.to_json() for r in rows],
                                                   "seconds": time.perf_counter() - started}, indent=1, default=str))
        text = tables(rows)
        (out / "plan.md").write_text(text)
        log.info("%s", text)
        log.info("plan: %d combination(s) in %.1f s, nothing trained: %s", len(rows), time.perf_counter() - started,
                 out / "plan.json")
    return 0


def plan_row(row: PlanRow | Mapping[str, Any]) -> PlanRow:
    """A row as harness.launch.on_preset.predict_on and a search write it (a mapping), read once into its record."""
    return row if isinstance(row, PlanRow) else PlanRow.from_json(row)


def tables(rows: Sequence[PlanRow | Mapping[str, Any]]) -> str:
    """Memory by kind for the largest rank, then time by part; what was not predicted, with why."""
    from rich.table import Table

    from harness.launch.console import render

    typed = [plan_row(r) for r in rows]
    predicted = [(r, r.prediction) for r in typed if r.status == "predicted" and r.prediction is not None]
    parts = []
    if predicted:
        memory = Table(title=f"Predicted peak memory per rank, MiB ({predicted[0][0].hardware})", title_justify="left")
        for name in ("combination", "params", "grads", "optim", "activ", "inputs", "comm", "alloc", "peak", "fits"):
            memory.add_column(name, justify="left" if name == "combination" else "right")
        for r, p in predicted:
            worst = max(p.memory, key=lambda m: m["peak_mib"])  # the planner's breakdown, as results.json keeps it
            memory.add_row(r.label, *[_mib(worst[k]) for k in ("params_mib", "grads_mib", "optimizer_mib",
                                                             "activations_mib", "inputs_mib", "comm_buffers_mib",
                                                             "allocator_mib", "peak_mib")],
                           "yes" if p.fits else "NO")
        parts.append(render(memory, width=110))
        speed = Table(title="Predicted time per iteration, ms", title_justify="left")
        for name in ("combination", "compute", "optim", "comm", "exposed", "overlap", "total", "throughput",
                     "90 % band", "MFU"):
            speed.add_column(name, justify="left" if name == "combination" else "right")
        for r, p in predicted:
            if p.s_per_iteration is None or p.throughput_img_s is None:  # would not fit: no time
                speed.add_row(r.label, *["—"] * 9)
                continue
            t = p.time
            speed.add_row(r.label, *[_ms(t[k]) for k in ("compute_s", "optimizer_s", "comm_s", "exposed_comm_s",
                                                         "overlapped_comm_s")],
                          f"{1000 * p.s_per_iteration:.2f}", rate_text(r, p.throughput_img_s) + (" *" if p.busy else ""),
                          band_text(p, r.tokens_per_sample), mfu_text(p.mfu))
        parts.append(render(speed, width=130))
        sources = dict.fromkeys(p.band_source for _, p in predicted)
        parts.append("Band: " + "; ".join(s for s in sources if s))
        busy_rows = [f"{r.label}: {p.busy}" for r, p in predicted if p.busy]
        if busy_rows:
            parts.append("* calibrated on a busy machine (predict again when it is quiet):\n" +
                         "\n".join(f"- {b}" for b in busy_rows))
        misfits = [f"{r.label}: {r.reason}" for r, _ in predicted if r.reason]
        if misfits:
            parts.append("Would not fit:\n" + "\n".join(f"- {m}" for m in misfits))
        assumptions = dict.fromkeys(a for _, p in predicted for a in p.assumptions)
        parts.append("Assumptions:\n" + "\n".join(f"- {a}" for a in assumptions))
    others = [r for r in typed if r.status != "predicted"]
    if others:
        parts.append("Not predicted:\n" + "\n".join(f"- {r.label}: {r.status}: {r.reason}" for r in others))
    return "\n\n".join(parts) + "\n"


def sample_unit(cfg: RunConfig) -> dict[str, Any]:
    """What the plan's rates count (PlanRow's fields of these names): tokens for a token model (its samples are
    sequences), else its samples."""
    from harness.prediction.predict import inputs_here

    inputs = inputs_here(cfg)
    unit = "tokens/s" if inputs.tokens_per_sample else "img/s" if inputs.kind == "images" else "samples/s"
    return {"tokens_per_sample": inputs.tokens_per_sample, "unit": unit}


def _figure(value: float) -> str:
    """Three significant figures at least, thousands grouped: 0.412, 3.25, 1,234 (never a rate rounded to 0 or 1)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def rate_text(row: PlanRow, samples_s: float) -> str:
    """`1,234 img/s`, or a token model's `142,830 tokens/s` (its samples/s times the sequence's tokens)."""
    tokens = row.tokens_per_sample
    return f"{_figure(samples_s * (tokens or 1))} {row.unit}"


def band_text(prediction: PredictionRecord, tokens_per_sample: int | None = None) -> str:
    """`1,234–1,890`, in the rate's unit: where 90 % of the truths fall by the band's source."""
    low, high = prediction.throughput_band or (None, None)
    scale = tokens_per_sample or 1
    return f"{_figure(low * scale)}–{_figure(high * scale)}" if low and high else "—"


def figure(row: PlanRow | Mapping[str, Any]) -> tuple[str, str]:
    """A predicted row's rate and its 90 % band, in its unit (tokens/s for a language model), as the tables word
    them (a search's answer: harness.search.preset)."""
    one = plan_row(row)
    assert one.prediction is not None, "a row that was predicted"
    return rate_text(one, one.prediction.throughput_img_s or 0.0), band_text(one.prediction, one.tokens_per_sample)


def mfu_text(mfu: float | None) -> str:
    """`41.2 %`: the model's FLOPs per second over the devices' peak (harness.prediction.predict.Prediction.mfu)."""
    return "—" if mfu is None else f"{100 * mfu:.1f} %"


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{1000 * seconds:.2f}"


def _mib(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def ensure_link(ranks: int, gpus: bool, repeats: int) -> None:
    """Before runs whose predictions need this machine's link: measure it once (cached by harness.prediction.hardware),
    and again where the cached one was taken another way (LINK_STATISTIC). A failed measurement leaves the
    predictions without communication, saying so; it never stops the runs."""
    from harness.prediction.hardware import read_machine

    cached = read_machine()
    if ranks < 2 or (cached.get("link") is not None and cached.get("link_statistic") == LINK_STATISTIC):
        return
    from harness.core.logs import setup_cli

    setup_cli()
    log.info("measuring this machine's link between %d ranks for the predictions (once: it is cached)", ranks)
    try:
        local_target("cuda" if gpus else "cpu", ranks, 1, lambda: measure_link(ranks, repeats))
    except Exception as error:  # noqa: BLE001
        log.warning("plan: this machine's link could not be measured (%s): predictions leave communication out",
                    error)


def check_plan_presets(configs: Sequence[RunConfig]) -> None:
    """Bad presets refused before anything starts (ConfigError)."""
    for cfg in configs:
        if cfg.plan.hardware != LOCAL:
            load_preset(cfg.plan.hardware)


__all__ = ["check_plan_presets", "ensure_link", "figure", "measure_link", "plan_command", "tables"]
