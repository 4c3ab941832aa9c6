"""Sampler overhead: the same `run.py` run with the memory sampler off and on at 10, 100 and 1000 ms.

    python bench/sampler.py [--models resnet18,tiny_cnn] [--rounds 4] [--write-results]

All runs of a model happen in one fresh process that composes each configuration from conf/ as `run.py`
does and calls `harness.launch.runner.execute` (what `run.py strategy=single` runs: the sampler thread lives in the
training process, as it does for a user). Each round runs the four settings back to back in a rotated order
(round r starts at setting r), so each setting is compared with the `memory.enabled=false` run of its own
round. Reported: throughput(on) / throughput(off), median and min–max over the rounds. Goal: the default
interval (100 ms) costs < 0.5 %, i.e. a ratio >= 0.995.

A difference of 0.5 % is below the run-to-run noise of a 2-core machine, so the script also measures the
sampler's own cost directly: the time one sample (`PsutilSource.read`) takes here, divided by the interval,
is the share of one core the sampler takes from the training threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import common

GOAL_COST = 0.005
SETTINGS = ("off", 10, 100, 1000)  # memory.interval_ms; "off" = memory.enabled=false
# Per model: image size, batch, iterations, log_every (as in bench/overhead.py).
LENGTH = {"resnet18": (32, 32, 60, 10), "tiny_cnn": (8, 8, 2000, 250)}


def overrides(model: str, setting: object, iterations: int, log_every: int, size: int, batch: int) -> list[str]:
    base = ["strategy=single", "amp=O0", f"model={model}", f"data.image_size={size}", f"batch_size={batch}",
            f"iterations={iterations}", f"log_every={log_every}"]
    if setting == "off":
        return [*base, "memory.enabled=false"]
    return [*base, "memory.enabled=true", f"memory.interval_ms={setting}"]


def inprocess_worker(w: dict[str, Any]) -> dict[str, Any]:
    """Every setting's run, round after round, in this process; throughput and samples taken per run."""
    configs = {str(s): overrides(w["model"], s, w["iterations"], w["log_every"], w["size"], w["batch"])
               for s in SETTINGS}
    composed = {s: common.compose_config(o) for s, o in configs.items()}
    guard = common.Guard(**w["guard"])
    rounds, records = [], []
    for r in range(w["rounds"]):
        order = [str(SETTINGS[(r + i) % len(SETTINGS)]) for i in range(len(SETTINGS))]

        def task(setting: str, r: int = r) -> dict[str, Any]:
            folder = Path(w["work"]) / f"{w['model']}-r{r}-{setting}"
            return common.execute_in_process(composed[setting], folder)

        done = guard.round([lambda s=s: task(s) for s in order], label=f"    round {r + 1}")
        runs = dict(zip(order, done.results, strict=True))
        rounds.append({s: {"throughput": run["throughput_img_s"], "samples": run["memory"].get("samples")}
                       for s, run in runs.items()})
        records.append(common.Guard.round_record(done))
        off = runs["off"]["throughput_img_s"]
        print(f"    round {r + 1}/{w['rounds']}: off {off:.1f} img/s; on/off "
              + ", ".join(f"{s} {runs[str(s)]['throughput_img_s'] / off:.4f}" for s in SETTINGS[1:])
              + ("" if done.clean else " *"), flush=True)
    return {"rounds": rounds, "guard": records}


def read_cost(samples: int) -> dict[str, Any]:
    """What the sampler's work costs here: listing the process tree (psutil reads /proc of every process on
    the machine), reading the known processes' memory, and how often the harness's source lists the tree."""
    import psutil

    from harness.memory.sampler import PsutilSource

    root = psutil.Process(os.getpid())
    listing, reading = [], []
    for _ in range(samples):
        t0 = time.perf_counter()
        procs = [root, *root.children(recursive=True)]
        t1 = time.perf_counter()
        for proc in procs:
            proc.memory_info()
        t2 = time.perf_counter()
        listing.append(t1 - t0)
        reading.append(t2 - t1)
    relist = getattr(PsutilSource, "RELIST_S", None)  # None: the tree is listed on every sample
    return {"list_s": statistics.median(listing), "read_s": statistics.median(reading),
            "relist_s": relist, "processes": len(psutil.pids())}


def core_share(cost: dict[str, Any], interval_s: float) -> float:
    """Share of one core the harness's source takes at `interval_s`."""
    lists_per_s = 1 / max(interval_s, cost["relist_s"]) if cost["relist_s"] else 1 / interval_s
    return cost["list_s"] * lists_per_s + cost["read_s"] / interval_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,tiny_cnn")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of the four settings per model (default 6)")
    parser.add_argument("--inprocess-worker", help=argparse.SUPPRESS)  # internal: JSON settings
    args = common.parse_args(parser, argv)
    if args.inprocess_worker:
        settings = json.loads(args.inprocess_worker)
        Path(settings["out"]).write_text(json.dumps(inprocess_worker(settings)))
        return 0

    models = ["tiny_cnn"] if args.quick else [m for m in args.models.split(",") if m]
    threads = common.cores()
    rounds = 1 if args.quick else args.rounds
    env = common.pinned_env(threads)
    settings = {"strategy": "single", "threads per process": threads, "OMP_NUM_THREADS": env["OMP_NUM_THREADS"],
                "image size / batch": ", ".join(f"{m} {LENGTH.get(m, LENGTH['resnet18'])[0]} px / "
                                                 f"{LENGTH.get(m, LENGTH['resnet18'])[1]}" for m in models),
                "rounds per model": rounds,
                "source": "psutil (CPU: resident memory of the launcher and its children)"}
    common.print_settings("Memory sampler overhead: memory.enabled=false vs interval 10/100/1000 ms", settings)
    guard = common.guard_from(args)

    cost = read_cost(20 if args.quick else 300)
    relist = f"once every {cost['relist_s']:g} s" if cost["relist_s"] else "on every sample"
    micro = common.Table("the sampler's own work, measured directly (median of 20–300 repetitions)",
                         ["what", "time", "interval 10 ms", "interval 100 ms", "interval 1000 ms"])
    micro.add(f"list the process tree ({cost['processes']} processes on the machine)", f"{cost['list_s'] * 1e6:.0f} µs",
              "", "", "")
    micro.add("read the known processes' memory", f"{cost['read_s'] * 1e6:.0f} µs", "", "", "")
    micro.add(f"harness's PsutilSource (lists the tree {relist}): share of one core", "",
              *[f"{100 * core_share(cost, ms / 1000):.3f} %" for ms in (10, 100, 1000)])

    table = common.Table("throughput with the sampler on / off (median (min–max) over rounds)",
                         ["model", "off img/s", "10 ms", "100 ms (default)", "1000 ms", "samples taken at 100 ms",
                          "default costs < 0.5 %"])
    verdicts = []
    with common.runs_dir(args, "sampler") as work:
        for model in models:
            size, batch, iterations, log_every = LENGTH.get(model, LENGTH["resnet18"])
            if args.quick:
                size, batch, iterations, log_every = 8, 8, 20, 10
            out = work / f"sampler-{model}.json"
            worker = {"model": model, "size": size, "batch": batch, "iterations": iterations, "log_every": log_every,
                      "rounds": rounds, "work": str(work), "out": str(out), "guard": common.guard_to_dict(guard)}
            print(f"  {model}: {rounds} rounds of the four settings, {iterations} iterations each", flush=True)
            data, _ = common.run_json([common.python(), Path(__file__).resolve(), "--inprocess-worker",
                                       json.dumps(worker)], out, env, timeout_s=3600, echo="    ")
            guard.absorb(data["guard"])
            rates = {str(s): [r[str(s)]["throughput"] for r in data["rounds"]] for s in SETTINGS}
            ratios = {str(s): [r[str(s)]["throughput"] / r["off"]["throughput"] for r in data["rounds"]]
                      for s in SETTINGS[1:]}
            samples = [int(r["100"]["samples"] or 0) for r in data["rounds"]]
            default = common.median(ratios["100"])
            met = default >= 1 - GOAL_COST
            table.add(f"{model} ({size} px, batch {batch})", common.fmt_spread(rates["off"], 1),
                      *[common.fmt_spread(ratios[s], 3) for s in ratios], common.fmt_spread(samples, 0),
                      "met" if met else "missed")
            verdicts.append(f"- {model}: sampler at 100 ms costs {100 * (1 - default):+.2f} % (ratio {default:.3f}, "
                            f"median of {rounds} rounds, min–max {min(ratios['100']):.3f}–{max(ratios['100']):.3f}) — "
                            f"goal < 0.5 % {common.verdict(met)}.")
    micro.print()
    table.print()
    direct = core_share(cost, 0.1)
    print(f"direct: the sampler's own work is {100 * direct:.3f} % of a core at 100 ms", flush=True)
    print(guard.summary(), flush=True)
    if args.write_results:
        lines = [*verdicts,
                 f"- Direct measurement: the sampler's own work is {100 * direct:.3f} % of one core at the default "
                 f"100 ms (tree listed {relist}); the end-to-end figures also include what its wake-ups cost the "
                 "training threads.", "",
                 "The end-to-end ratio compares runs of the same round only (rotated order); its spread (min–max) is "
                 "the machine's run-to-run noise, so the medians are estimates whose precision that spread shows. " + guard.summary() + ".", *NOTES]
        body = common.results_page("sampler", settings, [table, micro], lines)
        common.write_results("sampler", body, args.results_dir)
    return 0


NOTES = [
    "",
    "How the sampler costs throughput: for `strategy=single` its thread lives in the training process. Each time "
    "it wakes it takes the GIL from the training loop and, both cores being busy with the two OpenMP threads, "
    "preempts one of them, which stalls the other at its next barrier; so the cost follows the number of wake-ups "
    "more than the work per sample. The work per sample used to be ~0.4 ms (psutil lists the process tree by "
    "reading /proc of every process on the machine); the harness now lists the tree once a second and reads only "
    "the known processes' memory per sample (second table). Which row to judge by: the tiny model's iterations "
    "are sub-millisecond and steady on this VM, so its columns resolve fractions of a percent and fall "
    "monotonically with the interval; resnet18's neighbouring runs differ by 5–15 % here ([benchmark 4](timing_fidelity.md)'s CV), so its "
    "medians of a few rounds are not even monotonic in the interval (a 10 ms sampler cannot cost less than a "
    "100 ms one) and cannot resolve 0.5 %. Where the default still costs more than the goal, the remedy left is "
    "fewer wake-ups for one-process CPU runs (a longer default interval, e.g. 500 ms) or a sampler outside the "
    "training process.",
]


if __name__ == "__main__":
    sys.exit(main())
