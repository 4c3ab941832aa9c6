"""How right the predictions are: every case predicted before it runs (harness.prediction, on this machine's measured
preset), then measured, by `run.py -m` exactly as a user types it; the table shows each case's errors.

    python bench/prediction.py [--write-results]

Cases: single, ddp, zero, fsdp and allreduce x O0 and O1 (bfloat16) x tiny_cnn and resnet18 x 1 and 2 processes (single:
one). Memory: the largest rank's peak of live tensor bytes (CPU) or the allocator's reserved peak (GPU), against
the predicted peak. Time: the steady windows' seconds per iteration against the predicted one; the 2-process
cases are predicted from a 1-process calibration plus this machine's fitted link. Error = (measured - predicted)
/ measured. Goals: memory within 10 %, time within 15 %, per case. `--fresh N`: every case run in N fresh processes
(the sweep's `repeat=N`, rounds in shuffled order); a case's error is its medians', and the table shows the
measured range, the spread one run a case would have (default 1). Each case is a sweep of its own, predicted just
before its runs (a sweep predicts all its cases before its first run, and this VM's host drifts by tens of percent
in the minutes a long sweep takes); one thread's matrix rate is timed before and after each case's runs, and the
table shows after / before, the host's drift the case's error may carry.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import common

MEMORY_GOAL, TIME_GOAL = 0.10, 0.15


SPEED_FILE = "cpu_speed.json"  # in a case's folder: one thread's matrix rate before and after its runs
REFUSED_FILE = "refused.json"  # in a case's folder: its overrides and the harness's reason for refusing them


def cases(folder: Path) -> list[dict]:
    """Every run kept under `folder`, each with its case's CPU drift (after / before its runs) where recorded."""
    found = []
    for path in sorted(folder.rglob("results.json")):
        r = json.loads(path.read_text())
        speed = next((p / SPEED_FILE for p in path.parents if (p / SPEED_FILE).exists()), None)
        if speed is not None and speed.is_relative_to(folder):
            rates = json.loads(speed.read_text())
            r["cpu_drift"] = rates["after_tflops"] / rates["before_tflops"]
        found.append(r)
    return found


def each_case(overrides: Sequence[str]) -> list[list[str]]:
    """A sweep's overrides as its cases, each one run of `run.py -m OVERRIDES`, in the sweep's order (the harness's
    own expansion, harness.compose.combinations), so that each case can be a sweep of its own, predicted next to
    its runs."""
    from harness.compose import combinations, hydra_context

    with hydra_context():
        return combinations(overrides, multirun=True)


def case_label(model: str, strategy: str, amp: str, checkpoint: bool, variant: str = "") -> str:
    """A case as the table names it (a strategy's variant, e.g. sequence_parallel, as the report labels it)."""
    return f"{model} {strategy} {amp}{f' {variant}' if variant else ''}{' checkpoint' if checkpoint else ''}"


def cpu_speed() -> float:
    """One thread's float32 matrix rate now, TFLOP/s: the best of three timings (harness.prediction.hardware's)."""
    from harness.prediction.hardware import cpu_speed as timed
    return max(timed() for _ in range(3))


def sweep_case(case: list[str], folder: Path, timeout_s: float) -> None:
    """One case's sweep (predicted, then its fresh processes run), the CPU's speed timed either side; a case the
    harness refuses (a sweep of many would have made it a skipped row) is kept as refused, with its reason."""
    before = cpu_speed()
    try:
        common.sweep(case, folder, timeout_s=timeout_s)
    except common.Refused as refused:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / REFUSED_FILE).write_text(json.dumps({"overrides": case, "reason": refused.reason}))
        return
    (folder / SPEED_FILE).write_text(json.dumps({"before_tflops": before, "after_tflops": cpu_speed()}))


def refused_cases(folder: Path) -> list[tuple[str, str]]:
    """(label, reason) of each case kept under `folder` that the harness refused before running it."""
    found = []
    for path in sorted(folder.rglob(REFUSED_FILE)):
        record = json.loads(path.read_text())
        given = dict(o.split("=", 1) for o in record["overrides"])
        checkpoint = given.get("model.checkpoint", "false").lower() not in ("false", "none")
        found.append((case_label(given["model"], given["strategy"], given["amp"], checkpoint), record["reason"]))
    return found


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.1f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_case_args(parser)
    args = common.parse_args(parser, argv)
    # iterations per model: enough steady windows (20 iterations each) that a case's time is not one window's
    models = {"tiny_cnn": ["model=tiny_cnn", "iterations=400"], "resnet18": ["model=resnet18", "iterations=100"]}
    quick = {"tiny_cnn": ["model=tiny_cnn", "iterations=40", "batch_size=8"]}
    settings, tables, lines = run_cases(args, models, quick, "single, ddp, zero, fsdp, allreduce x O0, O1 bf16 x "
                                        "tiny_cnn, resnet18 x 1 and 2 processes")
    if args.write_results:
        common.write_results("prediction", common.results_page("prediction", settings, tables, lines,
                                                               command_of("prediction", args)), args.results_dir)
    return 0


def add_case_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fresh", type=int, default=1, metavar="N",
                        help="fresh processes a case (the sweep's repeat=N); its error is the medians' (default 1)")
    parser.add_argument("--from-runs", type=Path, default=None, metavar="DIR",
                        help="run nothing: the table of the runs kept in DIR (an earlier --runs-dir's folder)")


def command_of(name: str, args: argparse.Namespace) -> str:
    """The command line that measured a results page's figures."""
    fresh = f" --fresh {args.fresh}" if args.fresh != 1 else ""
    return f"python bench/{name}.py{fresh} --write-results"


def kept_runs_line(results: list[dict], fresh: int) -> str:
    """A table made from kept runs: when they ran, and the CPU others took during their timed windows."""
    timed = [r for r in results if r.get("started_at") and r.get("finished_at")]  # a skipped case ran nothing
    start, end = min(r["started_at"] for r in timed), max(r["finished_at"] for r in timed)
    machine = [r["machine"] for r in results if r.get("machine") and r["machine"].get("windows_s")]
    others = sum(m["others_cpu_s"] or 0.0 for m in machine) / max(sum(m["windows_s"] for m in machine), 1e-9)
    return (f"- {len(by_case(results))} cases, {len(results)} runs ({fresh} fresh processes a case, its medians "
            f"judged) in {(end - start) / 60:.1f} min, tabled from the kept runs; other processes took "
            f"{others:.2f} cores during the timed windows.")


def by_case(results: list[dict]) -> dict[tuple, list[dict]]:
    """The runs of each case (its fresh processes), in the table's order: model, strategy, processes, amp, ..."""
    def case(r: dict) -> tuple:
        return (r["model"], r["strategy"], r["world_size"] or 0, r["amp"], r["variant"],
                json.dumps(r["config"]["model"], sort_keys=True))

    grouped: dict[tuple, list[dict]] = {}
    for r in sorted(results, key=case):
        grouped.setdefault(case(r), []).append(r)
    return grouped


def case_figures(runs: list[dict]) -> dict[str, float] | None:
    """A case's medians over its measured runs: predicted and measured peak and s/it, and the measured s/it's
    range; None where no run measured both."""
    done = [r for r in runs if r["status"] == "ok" and r.get("prediction") and r.get("prediction_error")
            and r["prediction_error"]["measured_s_per_iteration"] and r["prediction_error"]["measured_peak_mib"]]
    if not done:
        return None
    measured = [r["prediction_error"]["measured_s_per_iteration"] for r in done]
    return {"peak_pred": statistics.median(r["prediction"]["peak_mib"] for r in done),
            "peak_meas": statistics.median(r["prediction_error"]["measured_peak_mib"] for r in done),
            "s_pred": statistics.median(r["prediction"]["s_per_iteration"] for r in done),
            "s_meas": statistics.median(measured), "s_low": min(measured), "s_high": max(measured),
            "runs": len(done)}


def run_cases(args: argparse.Namespace, models: dict[str, list[str]], quick: dict[str, list[str]],
              described: str, more: tuple[list[str], ...] = ()) -> tuple[dict, list, list[str]]:
    """Every case of `models` (each a model's overrides) predicted, then run and measured, and each sweep of
    `more` on every model (strategies that need their own process counts); --quick: `quick`'s, one process, O0.
    The settings, the table and the summary lines of a results page."""
    fresh = args.fresh
    common_overrides = [f"repeat={fresh}", "amp=O0,O1", "amp.dtype=bfloat16", "plan.predict=true"]
    if args.quick:  # seconds: the tiny model, two cases
        models = quick  # and no multi-process sweep
        common_overrides = [f"repeat={fresh}", "amp=O0", "plan.predict=true"]
    settings = {"cases": described,
                "overrides": " ".join(common_overrides) + "; " + "; ".join(" ".join(m) for m in models.values()),
                "cores": common.cores(), "OMP_NUM_THREADS": "pinned to the cores (common.pinned_env)"}
    common.print_settings("Predictions against measurements", settings)
    table = common.Table("predicted against measured, per case",
                         ["case", "procs", "peak MiB pred", "peak MiB meas", "memory error",
                          "ms/it pred", "ms/it meas", "ms/it meas range", "time error", "CPU after/before",
                          "within goals"])
    started = time.perf_counter()
    timeout_s = 300 * fresh  # a case's sweep's limit, the case run `fresh` times
    kept = args.from_runs
    with common.runs_dir(args, "prediction") if kept is None else contextlib.nullcontext(kept) as runs, \
            common.measure_load() as load:
        multi = "ddp,zero,fsdp,allreduce"
        for name, model in models.items() if kept is None else ():
            sweeps = [["strategy=single", *model, *common_overrides]]
            if not args.quick:
                sweeps += [[f"strategy={multi}", "nprocs=1,2", *model, *common_overrides],
                           *([*extra, *model, *common_overrides] for extra in more)]
            for k, case in enumerate(c for overrides in sweeps for c in each_case(overrides)):
                sweep_case(case, runs / f"{name}-{k:02d}", timeout_s)
        results, refused = cases(runs), refused_cases(runs)
    memory_errors, time_errors, beyond, drifts = [], [], [], []
    for runs_of_case in by_case(results).values():
        r = runs_of_case[0]
        label = case_label(r["model"], r["strategy"], r["amp"], bool(r["config"]["model"].get("checkpoint")),
                           r.get("variant") or "")
        f = case_figures(runs_of_case)
        if f is None:
            table.add(label, r.get("world_size") or "-", *["-"] * 8, f"{r['status']}: {r.get('error')}")
            continue
        memory = (f["peak_meas"] - f["peak_pred"]) / f["peak_meas"]
        seconds = (f["s_meas"] - f["s_pred"]) / f["s_meas"]
        memory_errors.append(abs(memory))
        time_errors.append(abs(seconds))
        ok = abs(memory) <= MEMORY_GOAL and abs(seconds) <= TIME_GOAL
        if not ok:
            beyond.append(label + f" ({r['world_size']} proc)")
        spread = f"{1000 * f['s_low']:.1f}-{1000 * f['s_high']:.1f}" if f["runs"] > 1 else "-"
        drift = r.get("cpu_drift")
        if drift is not None:
            drifts.append(drift)
        table.add(label, r["world_size"], f"{f['peak_pred']:.1f}", f"{f['peak_meas']:.1f}", pct(memory),
                  f"{1000 * f['s_pred']:.1f}", f"{1000 * f['s_meas']:.1f}", spread, pct(seconds),
                  "-" if drift is None else f"{drift:.2f}x", "yes" if ok else "NO")
    for label, reason in refused:
        table.add(label, "-", *["-"] * 8, f"refused: {reason}")
    table.print()
    took = time.perf_counter() - started

    def summary(errors: list[float]) -> str:
        return f"median {100 * statistics.median(errors):.1f} %, max {100 * max(errors):.1f} %" if errors else "n/a"

    each = "one fresh process a case" if fresh == 1 else f"{fresh} fresh processes a case, its medians judged"
    lines = [f"- {len(by_case(results))} cases, {len(results)} runs ({each}) in {took / 60:.1f} min; background "
             f"load {load.background:.2f} cores." if kept is None else kept_runs_line(results, fresh),
             f"- |memory error|: {summary(memory_errors)} (goal 10 % per case); |time error|: "
             f"{summary(time_errors)} (goal 15 % per case).",
             f"- Beyond a goal: {', '.join(beyond) if beyond else 'none'}.",
             "- The CPU's speed after a case's runs over before them (one thread's matrix rate): "
             + (f"{min(drifts):.2f}x to {max(drifts):.2f}x, median {statistics.median(drifts):.2f}x." if drifts
                else "not recorded (runs of one sweep for many cases, predicted before the first).")]
    print("\n".join(lines), flush=True)
    return settings, [table], lines


if __name__ == "__main__":
    sys.exit(main())
