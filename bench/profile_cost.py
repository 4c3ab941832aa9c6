"""What profile=true costs: the same DDP run through `run.py` with the profiler off and on, alternating.

    python bench/profile_cost.py [--model resnet18] [--rounds 3] [--write-results]

Three figures per round: (1) steady-state throughput with profile=true against profile=false — the profiled
window is left out of the steady figures, so this ratio should stay at 1 within the machine's noise (the
profiler must not leak into throughput); (2) the profiled window's time over the median steady window of the
same run (`profile.slowdown`: what recording every op costs that window); (3) the seconds spent starting and
stopping the profiler and writing nothing yet, outside every window (the gaps between rank 0's window spans,
taken from its record, beyond those of the run without the profiler) and the trace's size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import common


def gaps(run_dir: Path) -> float:
    """Seconds between rank 0's windows (outside every window: excluded from the run's clock)."""
    spans = json.loads((run_dir / "ranks" / "rank0.json").read_text())["window_spans"]
    return sum(b[0] - a[1] for a, b in zip(spans, spans[1:], strict=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=80)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = common.parse_args(parser, argv)

    model = "tiny_cnn" if args.quick else args.model
    size = 8 if args.quick else common.CPU_WORKLOAD["image_size"]
    batch = 8 if args.quick else common.CPU_WORKLOAD["batch_size"]
    iterations, log_every = (30, 10) if args.quick else (args.iterations, args.log_every)
    rounds = 1 if args.quick else args.rounds
    cores = common.cores()
    threads = max(1, cores // args.nprocs)
    settings = {"strategy": f"ddp, {args.nprocs} workers", "threads per process": threads,
                "OMP_NUM_THREADS": threads, "model": model, "global batch": batch, "image size": size,
                "iterations": f"{iterations} (windows of {log_every}: warm-up, profiled, then steady)",
                "rounds": rounds, "order": "off on, on off, ...", "backend": "gloo on lo"}
    env = common.pinned_env(threads)
    common.print_settings("What profile=true costs", settings)
    guard = common.guard_from(args)
    off_rates, on_rates, slowdowns, extra_gaps, trace_mib = [], [], [], [], []
    with common.runs_dir(args, "profile") as work:
        for r in range(rounds):
            order = [False, True] if r % 2 == 0 else [True, False]

            def task(profile: bool, r: int = r) -> common.HarnessRun:
                return common.run_harness(["strategy=ddp", f"nprocs={args.nprocs}", "amp=O0", f"model={model}",
                                           f"data.image_size={size}", f"batch_size={batch}",
                                           f"iterations={iterations}", f"log_every={log_every}",
                                           f"profile={str(profile).lower()}"],
                                          work / f"{'on' if profile else 'off'}-r{r}", env)

            done = guard.round([lambda p=p: task(p) for p in order], label=f"round {r + 1}")
            runs = dict(zip(order, done.results, strict=True))
            off_rates.append(runs[False].throughput)
            on_rates.append(runs[True].throughput)
            slowdowns.append(float(runs[True].results["profile"]["slowdown"]))
            extra_gaps.append(gaps(runs[True].run_dir) - gaps(runs[False].run_dir))
            trace_mib.append((runs[True].run_dir / "traces" / "rank0.json").stat().st_size / 2**20)
            print(f"  round {r + 1}/{rounds}: off {off_rates[-1]:.1f} img/s, on {on_rates[-1]:.1f} img/s, "
                  f"profiled window x{slowdowns[-1]:.2f}" + ("" if done.clean else " *"), flush=True)
    ratios = [on / off for on, off in zip(on_rates, off_rates, strict=True)]
    table = common.Table(f"{model}, DDP {args.nprocs} workers: profile=true against profile=false "
                         f"(median (min–max) over {rounds} rounds)",
                         ["measure", "value"])
    table.add("steady img/s, profile=false", common.fmt_spread(off_rates, 1))
    table.add("steady img/s, profile=true (profiled window left out)", common.fmt_spread(on_rates, 1))
    table.add("ratio on/off", common.fmt_spread(ratios, 3))
    table.add("profiled window / median steady window", common.fmt_spread(slowdowns, 2))
    table.add("profiler start + stop, outside every window (s)", common.fmt_spread(extra_gaps, 2))
    table.add("trace per rank (MiB)", common.fmt_spread(trace_mib, 1))
    table.print()
    print(guard.summary(), flush=True)
    if args.write_results:
        lines = [f"- Steady-state throughput with the profiler on is {common.median(ratios):.3f} of the run "
                 "without it (median of the rounds; the min–max is this machine's run-to-run noise).",
                 f"- The profiled window itself takes {common.median(slowdowns):.2f}× a steady window: that is "
                 "why it is left out of every steady figure.",
                 "", "Starting and stopping the profiler happen at window edges, outside the run's clock; they "
                 "lengthen the run by the figure in the table, not its windows. " + guard.summary() + "."]
        body = common.results_page("profile_cost", settings, [table], lines)
        common.write_results("profile_cost", body, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
