"""Sampler overhead: the same `run.py` run with the memory sampler off and on at 10, 100 and 1000 ms.

    python bench/sampler.py [--models resnet18,tiny_cnn] [--rounds 4] [--write-readme]

All runs of a model happen in one fresh process that composes each configuration from conf/ as `run.py`
does and calls `harness.runner.execute` (what `run.py strategy=single` runs: the sampler thread lives in the
training process, as it does for a user). Each round runs the four settings back to back in a rotated order
(round r starts at setting r), so each setting is compared with the `memory.enabled=false` run of its own
round. Reported: throughput(on) / throughput(off), median and min–max over the rounds. Goal: the default
interval (100 ms) costs < 0.5 %, i.e. a ratio >= 0.995. A fifth setting runs 100 ms with the proposed fix of
the psutil source (`CachedTreeSource`, swapped in inside this script's process only) to show what it buys.

A difference of 0.5 % is below the run-to-run noise of a 2-core machine, so the script also measures the
sampler's own cost directly: the time one sample (`PsutilSource.read`) takes here, divided by the interval,
is the share of one core the sampler takes from the training threads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import common

GOAL_COST = 0.005
# memory.interval_ms; "off" = memory.enabled=false; "cached" = 100 ms with CachedTreeSource (see below)
SETTINGS = ("off", 10, 100, 1000, "cached")
# Per model: image size, batch, iterations, log_every (as in bench/overhead.py).
LENGTH = {"resnet18": (32, 32, 60, 10), "tiny_cnn": (8, 8, 2000, 250)}


class CachedTreeSource:
    """For comparison only, swapped in for one setting inside the bench's own process: the proposed fix of
    harness/memory.py PsutilSource, the same readings with the process tree listed at most once a second
    (psutil's children() scans all of /proc) and only memory_info() of the known processes every sample."""

    name = "psutil"
    RESCAN_S = 1.0

    def __init__(self, root_pid: int) -> None:
        import psutil

        self._root = psutil.Process(root_pid)
        self._procs: list[Any] = []
        self._listed = float("-inf")

    def read(self) -> Any:
        import psutil

        from harness.memory import MIB, Sample

        now = time.monotonic()
        if now - self._listed >= self.RESCAN_S:
            self._procs, self._listed = [self._root, *self._root.children(recursive=True)], now
        sample = Sample()
        for proc in self._procs:
            try:
                sample.per_process[(proc.pid, "cpu")] = proc.memory_info().rss / MIB
            except psutil.Error:
                continue
        return sample

    def close(self) -> None:
        pass


@contextlib.contextmanager
def cached_tree_source() -> Iterator[bool]:
    """Make the harness's runner open a CachedTreeSource (this process only); yields False if it cannot."""
    import harness.runner as runner

    original = getattr(runner, "open_source", None)
    if original is None:
        yield False
        return
    runner.open_source = lambda accelerator, ids, pid, *a, **k: (CachedTreeSource(pid), None)  # type: ignore[attr-defined]
    try:
        yield True
    finally:
        runner.open_source = original  # type: ignore[attr-defined]


def overrides(model: str, setting: object, iterations: int, log_every: int, size: int, batch: int) -> list[str]:
    base = ["strategy=single", "amp=O0", f"model={model}", f"data.image_size={size}", f"batch_size={batch}",
            f"iterations={iterations}", f"log_every={log_every}"]
    if setting == "off":
        return [*base, "memory.enabled=false"]
    if setting == "cached":
        setting = 100
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
            if setting != "cached":
                return common.execute_in_process(composed[setting], folder, configs[setting])
            with cached_tree_source() as swapped:
                if not swapped:
                    raise common.BenchError("harness.runner.open_source is gone: update bench/sampler.py")
                return common.execute_in_process(composed[setting], folder, configs[setting])

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


def read_cost(samples: int) -> tuple[float, float, int]:
    """Median seconds of one PsutilSource.read() of this process's tree, as the sampler does it, and of
    one read of the same processes' memory without re-listing the tree; and processes on the machine."""
    import psutil

    from harness.memory import PsutilSource

    source = PsutilSource(os.getpid())
    known = [psutil.Process(os.getpid())]
    full, cached = [], []
    for _ in range(samples):
        t0 = time.perf_counter()
        source.read()
        t1 = time.perf_counter()
        for proc in known:
            proc.memory_info()
        t2 = time.perf_counter()
        full.append(t1 - t0)
        cached.append(t2 - t1)
    return statistics.median(full), statistics.median(cached), len(psutil.pids())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,tiny_cnn")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of the four settings per model (default 6)")
    parser.add_argument("--inprocess-worker", help=argparse.SUPPRESS)  # internal: JSON settings
    common.add_common_args(parser)
    args = parser.parse_args(argv)
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

    full_s, cached_s, nprocs = read_cost(20 if args.quick else 300)
    micro = common.Table("cost of one sample, measured directly (median of reads)",
                         ["what", "per sample", "interval 10 ms", "interval 100 ms", "interval 1000 ms"])
    for label, seconds in ((f"PsutilSource.read() (lists all {nprocs} processes on the machine)", full_s),
                           ("memory_info() of the already-known processes only", cached_s)):
        micro.add(label, f"{seconds * 1e6:.0f} µs", *[f"{100 * seconds / (ms / 1000):.3f} % of a core"
                                                       for ms in (10, 100, 1000)])

    table = common.Table("throughput with the sampler on / off (median (min–max) over rounds)",
                         ["model", "off img/s", "10 ms", "100 ms (default)", "1000 ms",
                          "100 ms, tree listed once a second (proposed fix)", "samples taken at 100 ms",
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
                            f"goal < 0.5 % {common.verdict(met)} by the end-to-end figure; with the process tree "
                            f"listed once a second (proposed fix): {100 * (1 - common.median(ratios['cached'])):+.2f} %.")
    micro.print()
    table.print()
    direct = full_s / 0.1
    print(f"direct: one sample takes {full_s * 1e6:.0f} µs, i.e. {100 * direct:.2f} % of a core at 100 ms", flush=True)
    print(guard.summary(), flush=True)
    if args.write_readme:
        lines = [*verdicts,
                 f"- Direct measurement: one sample takes {full_s * 1e6:.0f} µs here, {100 * direct:.2f} % of one "
                 f"core at the default 100 ms — goal < 0.5 % {common.verdict(direct < GOAL_COST)} by the direct "
                 "figure.", "",
                 "The end-to-end ratio compares runs of the same round only (rotated order). Its spread is the "
                 "machine's run-to-run noise, larger than the 0.5 % being looked for; the direct figure is the "
                 "precise one. " + guard.summary() + ".", *NOTES]
        body = common.readme_block("2. Memory sampler overhead", "python bench/sampler.py --write-readme", settings,
                                   [table, micro], lines)
        common.write_readme_block("sampler", body, args.readme)
    return 0


NOTES = [
    "",
    "Why the default interval costs more than one sample's CPU time suggests: `PsutilSource.read()` "
    "(harness/memory.py) calls `psutil.Process.children(recursive=True)` on every sample, and psutil builds "
    "the parent map by reading /proc/<pid>/stat of *every* process on the machine — in Python, holding the GIL "
    "for most of it. For `strategy=single` the sampler thread lives in the training process: ten times a second "
    "it takes the GIL from the training loop and preempts one of the two OpenMP threads on a 2-core machine, "
    "which stalls the other at the next barrier. The cost grows with the number of processes on the machine, "
    "not with the run. Listing the tree once a second and reading only `memory_info()` of the known processes "
    "(the \"proposed fix\" column; ~6 µs instead of ~400 µs per sample) removes it; proposed for harness/memory.py.",
]


if __name__ == "__main__":
    sys.exit(main())
