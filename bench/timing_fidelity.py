"""Timing fidelity against a clock the harness does not own: a differential measurement from outside.

    python bench/timing_fidelity.py [--model resnet18] [--n 400] [--pairs 5] [--write-results]

Each pair runs `run.py` twice as a user types it, identical but for the iteration count, N and 2N, in
alternating order, and times each whole process from this script (start to exit, time.perf_counter).
Everything but the extra N iterations (interpreter start, Hydra, imports, model building, warm-up, writing
results) is the same in both runs and cancels in the difference, so

    outside = wall(2N) - wall(N)        harness = cumulative(2N) - cumulative(N)

where cumulative is the harness's own window clock at the last edge of each run. The two must agree
within 2 % (median over pairs). Nothing in the harness is patched or imported for this: the only shared
thing is the machine. The run-to-run spread of steady-state throughput over all runs is reported beside it,
because it bounds what any single pair can show. On GPUs the window clock is checked against CUDA events
by the GPU check (tests/gpu).
"""

from __future__ import annotations

import argparse
import sys

import common

GOAL_PCT = 2.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--n", type=int, default=400, help="iterations of the shorter run (the longer runs 2N)")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=5)
    args = common.parse_args(parser, argv)

    model = "tiny_cnn" if args.quick else args.model
    size, batch = (8, 8) if args.quick else (common.CPU_WORKLOAD["image_size"], common.CPU_WORKLOAD["batch_size"])
    n, log_every = (40, 10) if args.quick else (args.n, args.log_every)
    pairs = 1 if args.quick else args.pairs
    threads = common.cores()
    env = common.pinned_env(threads)
    settings = {"strategy": "single", "model": model, "threads per process": threads,
                "OMP_NUM_THREADS": env["OMP_NUM_THREADS"], "batch": batch, "image size": size,
                "iterations": f"N = {n} and 2N = {2 * n} (windows of {log_every}, first excluded)", "pairs": pairs,
                "order": "N 2N, 2N N, ..."}
    common.print_settings("Timing fidelity: the harness's clock against whole-process wall time, differentially",
                          settings)
    guard = common.guard_from(args)
    base = ["strategy=single", "amp=O0", f"model={model}", f"data.image_size={size}", f"batch_size={batch}",
            f"log_every={log_every}"]
    table = common.Table("extra N iterations: the harness's own clock vs this script's, per pair",
                         ["pair", "wall N s", "wall 2N s", "outside (difference) s", "harness (difference) s",
                          "harness vs outside", "img/s N / 2N"])
    diffs, rates = [], []
    with common.runs_dir(args, "fidelity") as work:
        for k in range(pairs):
            def short(k: int = k) -> common.HarnessRun:
                return common.run_harness([*base, f"iterations={n}"], work / f"n-{k}", env)

            def long(k: int = k) -> common.HarnessRun:
                return common.run_harness([*base, f"iterations={2 * n}"], work / f"2n-{k}", env)

            order = [short, long] if k % 2 == 0 else [long, short]
            done = guard.round(order, label=f"pair {k + 1}")
            one, two = done.results if k % 2 == 0 else done.results[::-1]
            outside = two.proc.wall_s - one.proc.wall_s
            harness = two.results["windows"][-1]["cumulative_seconds"] - one.results["windows"][-1]["cumulative_seconds"]
            diff = 100 * (harness - outside) / outside
            diffs.append(diff)
            rates += [one.throughput, two.throughput]
            table.add(str(k + 1) + ("" if done.clean else " *"), f"{one.proc.wall_s:.3f}", f"{two.proc.wall_s:.3f}",
                      f"{outside:.3f}", f"{harness:.3f}", f"{diff:+.2f} %",
                      f"{one.throughput:.1f} / {two.throughput:.1f}")
            print(f"  pair {k + 1}/{pairs}: outside {outside:.3f} s, harness {harness:.3f} s ({diff:+.2f} %)", flush=True)
    median_diff = common.median(diffs)
    met = abs(median_diff) <= GOAL_PCT
    cv = common.cv_percent(rates)
    summary = common.Table("summary", ["measure", "value", "goal"])
    summary.add(f"harness vs outside clock on the extra {n} iterations (median over {pairs} pairs)",
                f"{median_diff:+.2f} % (min–max {min(diffs):+.2f}–{max(diffs):+.2f} %)",
                f"within ±{GOAL_PCT} %: {'met' if met else 'missed'}")
    summary.add(f"run-to-run CV of steady-state throughput ({len(rates)} runs)", f"{cv:.2f} %",
                f"reported ({common.fmt_spread(rates, 1)} img/s)")
    table.print()
    summary.print()
    print(guard.summary(), flush=True)
    if args.write_results:
        lines = [f"- The harness's time for the extra {n} iterations differs from the whole-process wall-time "
                 f"difference by {median_diff:+.2f} % (median of {pairs} pairs; min–max {min(diffs):+.2f}–"
                 f"{max(diffs):+.2f} %) — goal within {GOAL_PCT} % {common.verdict(met)}.",
                 f"- Run-to-run coefficient of variation of steady-state throughput over the {len(rates)} runs: "
                 f"{cv:.2f} %.", "",
                 "How it works: two runs of `run.py`, identical but for N and 2N iterations, each timed as a whole "
                 "process by this script; start-up, warm-up and writing results are the same in both and cancel, "
                 "so the wall-time difference is what the extra N iterations took, measured by a clock the harness "
                 "never reads. The harness's figure is the difference of its cumulative times at the last edge. "
                 "A pair's figure also holds the machine's drift between its two runs (see the CV), which is why "
                 "the median over pairs is the estimate. " + guard.summary() + "."]
        body = common.results_page("timing_fidelity", settings, [table, summary], lines)
        common.write_results("timing_fidelity", body, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
