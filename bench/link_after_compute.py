"""What one collective costs on this machine's link where a training step calls it: right after compute, or back
to back, against after a barrier (how the planner measures the link: harness.collectives).

    python bench/link_after_compute.py [--write-results]

Two gloo workers of one thread each (as `nprocs=2` runs on two cores), a FileStore between them. For each op and
size, in rounds that alternate the ways a call is made: after a barrier (the planner's measurement); after 2 or 4 ms
of one thread's matrix products started at a barrier (a step's compute between two calls, each rank's of the same
length); back to back (the previous call just done, as an all-reduce per parameter or ZeRO's broadcasts make them).
A call's time on a rank runs from its own issue to its return. After a barrier the table shows the slowest rank's,
averaged over the calls (the planner's link: `mean by size`); otherwise the mean over the ranks, averaged over the
calls: the step's end waits for the last rank to arrive and the call to finish, and the prediction already counts
one rank's compute, so what a call adds to a step is its mean time over the ranks (each rank's from the moment its
own compute ended). The added column is that less the planner's figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import common
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness.collectives.arithmetic import element_count
from harness.collectives.worker import collective_call

OPS = ("all_reduce", "all_gather", "broadcast")
SIZES = {"64 KiB": 64 * 1024, "256 KiB": 256 * 1024, "1 MiB": 1024 * 1024}
MODES = ("after a barrier", "after 2 ms of compute", "after 4 ms of compute", "back to back")
COMPUTE_MS = {"after 2 ms of compute": 2.0, "after 4 ms of compute": 4.0}


def compute_for(ms: float, a: torch.Tensor, b: torch.Tensor) -> None:
    """Matrix products until `ms` have passed: both ranks stop at about the same time after the barrier."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        torch.mm(a, b)


def timed(mode: str, call: Callable[[], object], calls: int, a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """This rank's seconds for `calls` calls made the way `mode` says."""
    seconds = []
    if mode == "back to back":
        dist.barrier()
        call()  # the first follows the barrier: the rest follow a call
    for _ in range(calls):
        if mode != "back to back":
            dist.barrier()
            if mode in COMPUTE_MS:
                compute_for(COMPUTE_MS[mode], a, b)
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds


def worker(rank: int, n: int, store: str, cases: list[tuple[str, int]], calls: int, rounds: int,
           out: object) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    rows = []
    for op, size in cases:
        call = collective_call(op, element_count(op, size, n, 4), torch.float32, torch.device("cpu"), rank, n)
        for _ in range(3):
            call()
        per_mode: dict[str, list[list[float]]] = {mode: [] for mode in MODES}
        for r in range(rounds):  # the modes alternate, in a different order each round: the host's drift shared
            for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                mine = torch.tensor(timed(mode, call, calls, a, b), dtype=torch.float64)
                every = [torch.empty_like(mine) for _ in range(n)]
                dist.all_gather(every, mine)
                per_mode[mode] += [list(x) for x in zip(*(t.tolist() for t in every), strict=True)]
        rows.append((op, size, per_mode))
    if rank == 0:
        out.put(rows)  # type: ignore[attr-defined]
    dist.destroy_process_group()


def measure(cases: list[tuple[str, int]], calls: int, rounds: int, n: int = 2) -> list[tuple[str, int, dict]]:
    """Each case's per-call times on every rank, by mode: [(op, size, {mode: [[rank0 s, rank1 s], ...]})]."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory(prefix="link-after-compute-") as folder:
        workers = [context.Process(target=worker, args=(rank, n, os.path.join(folder, "store"), cases, calls, rounds,
                                                        queue)) for rank in range(n)]
        for w in workers:
            w.start()
        rows = queue.get(timeout=600)
        for w in workers:
            w.join(timeout=60)
    if any(w.exitcode != 0 for w in workers):
        raise common.BenchError(f"a worker failed: exit codes {[w.exitcode for w in workers]}")
    return rows


def slowest_ms(calls: list[list[float]]) -> float:
    """The planner's statistic: each call's slowest rank, averaged over the calls."""
    return 1e3 * statistics.fmean(max(ranks) for ranks in calls)


def over_ranks_ms(calls: list[list[float]]) -> float:
    """What a call adds to a step: each call's mean over the ranks, averaged over the calls."""
    return 1e3 * statistics.fmean(statistics.fmean(ranks) for ranks in calls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = common.parse_args(parser, argv)
    ops, sizes = (OPS[:1], dict(list(SIZES.items())[1:2])) if args.quick else (OPS, SIZES)
    calls, rounds = (10, 1) if args.quick else (50, 3)
    settings = {"workers": 2, "backend": "gloo", "threads a worker": 1, "calls a mode and round": calls,
                "rounds": rounds, "matrix products": "256 x 256 float32, one thread",
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "not set")}
    common.print_settings("A call's cost after compute, back to back and after a barrier", settings)
    with common.measure_load() as load:
        rows = measure([(op, size) for op in ops for size in sizes.values()], calls, rounds)
    names = {size: name for name, size in SIZES.items()}
    table = common.Table("one call on two gloo workers, ms (after a barrier: the slowest rank's, the planner's link; "
                         "the others: the mean over the ranks, what a step pays)",
                         ["op", "size", "after a barrier", *[f"{m} (added)" for m in MODES[1:]]])
    added: dict[str, list[float]] = {mode: [] for mode in MODES[1:]}
    for op, size, per_mode in rows:
        planner = slowest_ms(per_mode[MODES[0]])
        cells = []
        for mode in MODES[1:]:
            paid = over_ranks_ms(per_mode[mode])
            added[mode].append(paid - planner)
            cells.append(f"{paid:.2f} ({paid - planner:+.2f})")
        table.add(op, names[size], f"{planner:.2f}", *cells)
    table.print()
    lines = [f"- Added over the planner's link, median over the {len(rows)} op and size pairs: " + "; ".join(
        f"{mode} {statistics.median(values):+.2f} ms (range {min(values):+.2f} to {max(values):+.2f})"
        for mode, values in added.items()) + f". Background load {load.background:.2f} cores.",
        "- Benchmark 15's two-process cases call after compute: FSDP2 15 times a step (each unit's all-gather "
        "forward and backward, its reduce-scatter), TP 20 times (4 a block, 4 for the head); the all-reduce by hand "
        "per parameter and "
        "ZeRO's broadcasts back to back. The planner's link measurement times each op after 1-8 ms of compute too "
        "and prices each call that follows compute by it (harness.planning.after_compute_costs, "
        "harness.prediction.predict.comm_time)."]
    for line in lines:
        print(line, flush=True)
    if args.write_results:
        common.write_results("link_after_compute", common.results_page("link_after_compute", settings, [table],
                                                                       lines), args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
