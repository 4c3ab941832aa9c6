"""Sharding and compressed communication on CPU: ZeRO, FSDP2 and DDP's communication hooks against DDP.

    python bench/modern.py [--rounds 2] [--write-results]

Two gloo workers on the same global batch, through `run.py`. Each round runs every configuration back to
back in a rotated order; the table shows medians over the rounds: throughput, the ratio to plain DDP, each
worker's measured resident-memory growth (the sampler's peak) beside the theory per rank for parameters,
gradients and optimizer state (`memory_theory` in results.json), and start-up.
"""

from __future__ import annotations

import argparse
import sys

import common

CONFIGS: list[tuple[str, list[str]]] = [
    ("ddp", ["strategy=ddp"]),
    ("zero", ["strategy=zero"]),
    ("fsdp", ["strategy=fsdp"]),
    ("ddp comm_hook=fp16", ["strategy=ddp", "strategy.comm_hook=fp16"]),
    ("ddp comm_hook=bf16", ["strategy=ddp", "strategy.comm_hook=bf16"]),
    ("ddp comm_hook=powersgd", ["strategy=ddp", "strategy.comm_hook=powersgd"]),
]
QUICK = ("ddp", "fsdp")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--optim", default="adamw", help="adamw: optimizer state twice the parameters")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = common.parse_args(parser, argv)

    model = "tiny_cnn" if args.quick else args.model
    size = 8 if args.quick else common.CPU_WORKLOAD["image_size"]
    batch = 8 if args.quick else args.batch_size
    iterations, log_every = (20, 10) if args.quick else (args.iterations, args.log_every)
    rounds = 1 if args.quick else args.rounds
    configs = [c for c in CONFIGS if c[0] in QUICK] if args.quick else CONFIGS
    cores = common.cores()
    env = common.pinned_env(max(1, cores // 2))
    settings = {"model": model, "optimizer": args.optim, "global batch": batch, "image size": size,
                "workers": 2, "cores": cores, "OMP_NUM_THREADS (per worker)": max(1, cores // 2),
                "iterations": f"{iterations} (windows of {log_every}, first excluded)", "rounds": rounds,
                "backend": "gloo on lo", "amp": "O0"}
    common.print_settings("ZeRO, FSDP2 and DDP communication hooks against DDP, 2 workers on CPU", settings)
    guard = common.guard_from(args)
    rates: dict[str, list[float]] = {name: [] for name, _ in configs}
    peaks: dict[str, list[float]] = {name: [] for name, _ in configs}
    theory: dict[str, float] = {}
    startup: dict[str, list[float]] = {name: [] for name, _ in configs}
    with common.runs_dir(args, "modern") as work:
        for r in range(rounds):
            order = [configs[(r + i) % len(configs)] for i in range(len(configs))]

            def task(config: tuple[str, list[str]], r: int = r) -> common.HarnessRun:
                name, overrides = config
                return common.run_harness([*overrides, "nprocs=2", "amp=O0", f"optim={args.optim}", f"model={model}",
                                           f"data.image_size={size}", f"batch_size={batch}",
                                           f"iterations={iterations}", f"log_every={log_every}"],
                                          work / f"{name.replace(' ', '_').replace('=', '-')}-r{r}", env)

            done = guard.round([lambda c=c: task(c) for c in order], label=f"round {r + 1}")
            for (name, _), run in zip(order, done.results, strict=True):
                rates[name].append(run.throughput)
                used = [d["peak_mib"] - d["baseline_mib"] for d in run.results["memory"]["per_device"]]
                peaks[name].append(max(used) if used else float("nan"))
                theory[name] = run.results["memory_theory"]["total_mib"]
                startup[name].append(run.results["startup_seconds"])
            print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n}: {rates[n][-1]:.1f} img/s" for n, _ in configs)
                  + ("" if done.clean else " *"), flush=True)
    reference = common.median(rates["ddp"])
    table = common.Table(f"{model}, global batch {batch}, 2 workers (medians over {rounds} rounds)",
                         ["configuration", "img/s (min–max)", "vs ddp", "worker memory growth MiB",
                          "theory MiB/rank (params+grads+state)", "start-up s"])
    lines = []
    for name, _ in configs:
        rate = common.median(rates[name])
        table.add(name, common.fmt_spread(rates[name], 1), f"{rate / reference:.2f}",
                  f"{common.median(peaks[name]):.0f}", f"{theory[name]:.3g}", f"{common.median(startup[name]):.1f}")
        if name != "ddp":
            lines.append(f"- {name}: {rate:.1f} img/s, {rate / reference:.2f} of DDP; theory {theory[name]:.3g} MiB "
                         f"per rank against DDP's {theory['ddp']:.3g}.")
    table.print()
    print(guard.summary(), flush=True)
    if args.write_results:
        lines += ["", "vs ddp = throughput / DDP's on the same workers and batch. Worker memory growth is the "
                  "largest worker's resident-memory peak above its start (psutil); the theory counts only "
                  "parameters, gradients and optimizer state. " + guard.summary() + "."]
        body = common.results_page("modern", settings, [table], lines)
        common.write_results("modern", body, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
