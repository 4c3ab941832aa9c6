"""Scaling on CPU: DDP with 1, 2 and 4 gloo workers on the same global batch, through `run.py`.

    python bench/scaling.py [--nprocs 1,2,4] [--rounds 2] [--write-results]

The cores do not grow with the workers: every configuration shares the same machine, and the harness gives
each worker cores // nprocs threads (at least 1), so 4 workers on 2 cores is the "more processes than
cores" case. Efficiency is therefore measured against one worker using all the cores (1.00 = splitting the
work into processes cost nothing); `strategy=single` is shown for reference. Each round runs every
configuration back to back in a rotated order; the table shows medians over the rounds.
"""

from __future__ import annotations

import argparse
import sys

import common


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--nprocs", default="1,2,4")
    parser.add_argument("--batch-size", type=int, default=32, help="global batch (a multiple of every nprocs)")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = common.parse_args(parser, argv)

    model = "tiny_cnn" if args.quick else args.model
    size = 8 if args.quick else common.CPU_WORKLOAD["image_size"]
    batch = 8 if args.quick else args.batch_size
    iterations, log_every = (20, 10) if args.quick else (args.iterations, args.log_every)
    rounds = 1 if args.quick else args.rounds
    counts = [2] if args.quick else [int(n) for n in args.nprocs.split(",") if n]
    cores = common.cores()
    env = common.pinned_env(cores)
    configs: list[tuple[str, int]] = [("single", 1)] + [("ddp", n) for n in counts]
    settings = {"model": model, "global batch": batch, "image size": size, "cores": cores,
                "threads per process": ", ".join(f"{max(1, cores // n)} with {n} worker(s)" for n in counts)
                + f" (OMP_NUM_THREADS the same; single: {cores})",
                "iterations": f"{iterations} (windows of {log_every}, first excluded)", "rounds": rounds,
                "backend": "gloo on lo"}
    common.print_settings(f"Scaling on CPU: DDP with {', '.join(map(str, counts))} workers, same global batch",
                          settings)
    guard = common.guard_from(args)
    rates: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    threads: dict[tuple[str, int], int] = {}
    startup: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    with common.runs_dir(args, "scaling") as work:
        for r in range(rounds):
            order = [configs[(r + i) % len(configs)] for i in range(len(configs))]

            def task(config: tuple[str, int], r: int = r) -> common.HarnessRun:
                strategy, n = config
                extra = [f"nprocs={n}"] if strategy == "ddp" else []
                return common.run_harness([f"strategy={strategy}", *extra, "amp=O0", f"model={model}",
                                           f"data.image_size={size}", f"batch_size={batch}",
                                           f"iterations={iterations}", f"log_every={log_every}"],
                                          work / f"{strategy}{n}-r{r}", env)

            done = guard.round([lambda c=c: task(c) for c in order], label=f"round {r + 1}")
            for config, run in zip(order, done.results, strict=True):
                rates[config].append(run.throughput)
                threads[config] = int(run.results["threads_per_process"])
                startup[config].append(run.first_iteration_at() - run.proc.launched_at)
            print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{s} {n}: {rates[(s, n)][-1]:.1f} img/s"
                                                          for s, n in configs) + ("" if done.clean else " *"),
                  flush=True)
    reference = common.median(rates[("ddp", 1)]) if ("ddp", 1) in rates else None
    table = common.Table(f"{model}, global batch {batch}, {cores} cores (medians over {rounds} rounds)",
                         ["configuration", "processes per core", "threads per process", "img/s (min–max)",
                          "efficiency vs 1 worker", "command → first iteration s"])
    lines = []
    for config in configs:
        strategy, n = config
        label = "strategy=single" if strategy == "single" else f"ddp nprocs={n}"
        rate = common.median(rates[config])
        efficiency = f"{rate / reference:.2f}" if reference else "—"
        table.add(label, f"{n / cores:g}", threads[config], common.fmt_spread(rates[config], 1), efficiency,
                  f"{common.median(startup[config]):.1f}")
        if strategy == "ddp" and reference:
            lines.append(f"- {n} worker(s), {threads[config]} thread(s) each, {n / cores:g} per core: "
                         f"{rate:.1f} img/s, {rate / reference:.2f} of one worker on all cores.")
    table.print()
    print(guard.summary(), flush=True)
    if args.write_results:
        lines += ["", "Efficiency = throughput / throughput of `ddp nprocs=1` on the same cores and global batch. "
                  + guard.summary() + ".", *NOTES]
        body = common.results_page("scaling", settings, [table], lines)
        common.write_results("scaling", body, args.results_dir)
    return 0


NOTES = [
    "",
    "What the table says to a user: on a CPU-only machine, processes do not add cores. Splitting the same global "
    "batch over more workers only adds gradient all-reduce (gloo, over loopback, every iteration) and, past one "
    "worker per core, time-slicing of the workers, each of which waits for the slowest at every all-reduce. "
    "`ddp nprocs=1` is already below `strategy=single`: DDP with a world of one still copies gradients into "
    "buckets and runs the all-reduce, and the launcher process (elastic agent, memory sampler) shares the cores. "
    "The harness accepts up to 4 workers per core (a larger `nprocs` is refused as a typo); this is what they cost.",
]


if __name__ == "__main__":
    sys.exit(main())
