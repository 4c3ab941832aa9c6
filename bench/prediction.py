"""How right the predictions are: every case predicted before it runs (harness.prediction, on this machine's measured
preset), then measured, by `run.py -m` exactly as a user types it; the table shows each case's errors.

    python bench/prediction.py [--write-results]

Cases: single, ddp, zero, fsdp and allreduce x O0 and O1 (bfloat16) x tiny_cnn and resnet18 x 1 and 2 processes (single:
one). Memory: the largest rank's peak of live tensor bytes (CPU) or the allocator's reserved peak (GPU), against
the predicted peak. Time: the steady windows' seconds per iteration against the predicted one; the 2-process
cases are predicted from a 1-process calibration plus this machine's fitted link. Error = (measured - predicted)
/ measured. Goals: memory within 10 %, time within 15 %, per case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import common

MEMORY_GOAL, TIME_GOAL = 0.10, 0.15


def cases(folder: Path) -> list[dict]:
    found = []
    for path in sorted(folder.rglob("results.json")):
        r = json.loads(path.read_text())
        found.append(r)
    return found


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.1f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = common.parse_args(parser, argv)
    # iterations per model: enough steady windows (20 iterations each) that a case's time is not one window's
    models = {"tiny_cnn": ["model=tiny_cnn", "iterations=400"], "resnet18": ["model=resnet18", "iterations=100"]}
    quick = {"tiny_cnn": ["model=tiny_cnn", "iterations=40", "batch_size=8"]}
    settings, tables, lines = run_cases(args, models, quick, "single, ddp, zero, fsdp, allreduce x O0, O1 bf16 x "
                                        "tiny_cnn, resnet18 x 1 and 2 processes")
    if args.write_results:
        common.write_results("prediction", common.results_page("prediction", settings, tables, lines),
                             args.results_dir)
    return 0


def run_cases(args: argparse.Namespace, models: dict[str, list[str]], quick: dict[str, list[str]],
              described: str, more: tuple[list[str], ...] = ()) -> tuple[dict, list, list[str]]:
    """Every case of `models` (each a model's overrides) predicted, then run and measured, and each sweep of
    `more` on every model (strategies that need their own process counts); --quick: `quick`'s, one process, O0.
    The settings, the table and the summary lines of a results page."""
    common_overrides = ["repeat=1", "amp=O0,O1", "amp.dtype=bfloat16", "plan.predict=true"]
    if args.quick:  # seconds: the tiny model, two cases
        models = quick  # and no multi-process sweep
        common_overrides = ["repeat=1", "amp=O0", "plan.predict=true"]
    settings = {"cases": described,
                "overrides": " ".join(common_overrides) + "; " + "; ".join(" ".join(m) for m in models.values()),
                "cores": common.cores(), "OMP_NUM_THREADS": "pinned to the cores (common.pinned_env)"}
    common.print_settings("Predictions against measurements", settings)
    table = common.Table("predicted against measured, per case",
                         ["case", "procs", "peak MiB pred", "peak MiB meas", "memory error",
                          "ms/it pred", "ms/it meas", "time error", "within goals"])
    started = time.perf_counter()
    with common.runs_dir(args, "prediction") as runs, common.measure_load() as load:
        multi = "ddp,zero,fsdp,allreduce"
        for name, model in models.items():
            common.sweep(["strategy=single", *model, *common_overrides], runs / f"{name}-single")
            if not args.quick:
                common.sweep([f"strategy={multi}", "nprocs=1,2", *model, *common_overrides], runs / f"{name}-multi")
                for k, extra in enumerate(more):
                    common.sweep([*extra, *model, *common_overrides], runs / f"{name}-more{k}")
        results = cases(runs)
    memory_errors, time_errors, beyond = [], [], []
    for r in sorted(results, key=lambda r: (r["model"], r["strategy"], r["world_size"] or 0, r["amp"], r["variant"],
                                            json.dumps(r["config"]["model"], sort_keys=True))):
        checkpoint = " checkpoint" if r["config"]["model"].get("checkpoint") else ""
        label = f"{r['model']} {r['strategy']} {r['amp']}{checkpoint}"
        p, e = r.get("prediction"), r.get("prediction_error")
        if r["status"] != "ok" or not p or not e:
            table.add(label, r.get("world_size") or "-", "-", "-", "-", "-", "-", "-", f"{r['status']}: {r.get('error')}")
            continue
        memory, seconds = e["peak_mib"], e["s_per_iteration"]
        memory_errors.append(abs(memory)) if memory is not None else None
        time_errors.append(abs(seconds)) if seconds is not None else None
        ok = memory is not None and abs(memory) <= MEMORY_GOAL and seconds is not None and abs(seconds) <= TIME_GOAL
        if not ok:
            beyond.append(label + f" ({r['world_size']} proc)")
        table.add(label, r["world_size"], f"{p['peak_mib']:.1f}", f"{e['measured_peak_mib']:.1f}", pct(memory),
                  f"{1000 * p['s_per_iteration']:.1f}",
                  f"{1000 * e['measured_s_per_iteration']:.1f}" if e["measured_s_per_iteration"] else "n/a",
                  pct(seconds), "yes" if ok else "NO")
    table.print()
    took = time.perf_counter() - started

    def summary(errors: list[float]) -> str:
        return f"median {100 * statistics.median(errors):.1f} %, max {100 * max(errors):.1f} %" if errors else "n/a"

    lines = [f"- {len(results)} cases in {took / 60:.1f} min; background load {load.background:.2f} cores.",
             f"- |memory error|: {summary(memory_errors)} (goal 10 % per case); |time error|: "
             f"{summary(time_errors)} (goal 15 % per case).",
             f"- Beyond a goal: {', '.join(beyond) if beyond else 'none'}."]
    print("\n".join(lines), flush=True)
    return settings, [table], lines


if __name__ == "__main__":
    sys.exit(main())
