"""DDP through the harness against plain torchrun: `run.py strategy=ddp nprocs=2` vs
`torchrun --standalone --nproc-per-node=2` running the plain DDP script below, doing the same work.

    python bench/ddp_vs_torchrun.py [--model resnet18] [--repeats 5] [--write-results]

Same model class, seed (weights identical on every rank, data seed + rank), global batch split over the
ranks, SGD settings, gloo on the loopback interface, OMP_NUM_THREADS = torch.set_num_threads = cores //
nprocs in every worker. Both sides' steady-state throughput uses the same definition (cumulative time of
the slowest rank, warm-up window excluded). Startup is measured the same way for both, by this script's
clock: from just before the command is started to the moment the last rank begins its first iteration
(each rank's time.time() right after the barrier that precedes the timed loop). Goal: harness/torchrun
throughput >= 0.98.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import common
from overhead import make_model

GOAL = 0.98


def plain_ddp_worker(w: dict[str, Any]) -> None:
    """The comparator, started by torchrun: a plain DDP loop, timed with time.perf_counter."""
    import faulthandler

    faulthandler.enable()  # a native abort prints where it happened
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(w["threads"])
    torch.manual_seed(w["seed"])
    model = DistributedDataParallel(make_model(w["model"], w["num_classes"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=w["lr"], momentum=w["momentum"])
    generator = torch.Generator().manual_seed(w["seed"] + rank)
    local = w["batch_size"] // world
    images = torch.randn(local, 3, w["image_size"], w["image_size"], generator=generator)
    labels = torch.randint(0, w["num_classes"], (local,), generator=generator)
    model.train()
    dist.barrier()
    first = time.time()
    start = time.perf_counter()
    cumulative = []
    for it in range(1, w["iterations"] + 1):
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if it % w["log_every"] == 0:
            loss.item()
            cumulative.append(time.perf_counter() - start)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, {"first": first, "cumulative": cumulative, "threads": torch.get_num_threads(),
                                      "omp": os.environ.get("OMP_NUM_THREADS")})
    if rank == 0:
        Path(w["out"]).write_text(json.dumps(everyone))
    dist.barrier()  # nobody tears gloo down while a peer still talks to it
    dist.destroy_process_group()


def slowest_rank_windows(cumulative_per_rank: list[list[float]]) -> list[float]:
    """Window seconds of the run, its clock being its slowest rank (the harness's documented definition)."""
    edges = [max(c[i] for c in cumulative_per_rank) for i in range(min(map(len, cumulative_per_rank)))]
    return [b - a for a, b in zip([0.0, *edges], edges, strict=False)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5, help="A/B pairs (default 5)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: JSON settings, started by torchrun
    args = common.parse_args(parser, argv)
    if args.worker:
        plain_ddp_worker(json.loads(args.worker))
        return 0

    model = "tiny_cnn" if args.quick else args.model
    size, batch = (8, 8) if args.quick else (common.CPU_WORKLOAD["image_size"], common.CPU_WORKLOAD["batch_size"])
    iterations, log_every = (20, 10) if args.quick else (args.iterations, args.log_every)
    repeats = 1 if args.quick else args.repeats
    nprocs = args.nprocs
    threads = max(1, common.cores() // nprocs)
    # The harness's workers get OMP_NUM_THREADS = cores // nprocs from the harness itself; torchrun's inherit it.
    env = common.pinned_env(threads, {"GLOO_SOCKET_IFNAME": "lo"})
    settings = {"model": model, "processes": nprocs, "threads per process": threads,
                "OMP_NUM_THREADS (workers)": threads, "global batch": batch, "image size": size,
                "iterations": f"{iterations} (windows of {log_every}, first excluded)", "pairs": repeats,
                "order": "A B, B A, ...", "backend": "gloo on lo"}
    common.print_settings(f"DDP: run.py strategy=ddp nprocs={nprocs} vs torchrun --nproc-per-node={nprocs}", settings)
    guard = common.guard_from(args)
    h_rates: list[float] = []
    t_rates: list[float] = []
    h_start: list[float] = []
    t_start: list[float] = []
    h_own_start: list[float] = []
    comparator_failures: list[str] = []
    with common.runs_dir(args, "ddp") as work:
        for pair in range(repeats):
            def harness(pair: int = pair) -> tuple[float, float, float]:
                run = common.run_harness(
                    ["strategy=ddp", f"nprocs={nprocs}", "amp=O0", f"model={model}", f"data.image_size={size}",
                     f"batch_size={batch}", f"iterations={iterations}", f"log_every={log_every}"],
                    work / f"harness-{pair}", env)
                own = run.results.get("command_startup_seconds") or run.results.get("startup_seconds") or float("nan")
                return run.throughput, run.first_iteration_at() - run.proc.launched_at, own

            def torchrun(pair: int = pair) -> tuple[float, float]:
                out = work / f"torchrun-{pair}.json"
                worker = {"model": model, "iterations": iterations, "log_every": log_every, "threads": threads,
                          "batch_size": batch, "image_size": size, "out": str(out),
                          **{k: v for k, v in common.CPU_WORKLOAD.items() if k not in ("image_size", "batch_size")}}
                cmd = [Path(common.python()).with_name("torchrun"), "--standalone", f"--nproc-per-node={nprocs}",
                       Path(__file__).resolve(), "--worker", json.dumps(worker)]
                for attempt in range(3):
                    try:
                        ranks, proc = common.run_json(cmd, out, env)
                        break
                    except common.BenchError as error:
                        # The plain script, not the harness: a worker of it has been seen to die of SIGABRT
                        # (1 run in ~20, no message); start it again, and say so.
                        comparator_failures.append(str(error).splitlines()[0][:200])
                        print(f"  torchrun comparator failed (attempt {attempt + 1}), starting it again:\n"
                              + "\n".join(line for line in str(error).splitlines()
                                           if "Fatal Python error" in line or "File " in line)[-2000:], flush=True)
                        if attempt == 2:
                            raise
                windows = slowest_rank_windows([r["cumulative"] for r in ranks])
                assert all(r["threads"] == threads for r in ranks), ranks
                rate = common.steady_throughput(windows, batch * log_every, 1)
                return rate, max(r["first"] for r in ranks) - proc.launched_at

            order = [harness, torchrun] if pair % 2 == 0 else [torchrun, harness]
            done = guard.round(order, label=f"pair {pair + 1}")
            h, t = done.results if pair % 2 == 0 else done.results[::-1]
            h_rates.append(h[0])
            h_start.append(h[1])
            h_own_start.append(h[2])
            t_rates.append(t[0])
            t_start.append(t[1])
            print(f"  pair {pair + 1}/{repeats}: harness {h[0]:.1f} img/s (first iteration after {h[1]:.2f} s), "
                  f"torchrun {t[0]:.1f} img/s (after {t[1]:.2f} s), ratio {h[0] / t[0]:.4f}"
                  + ("" if done.clean else " *"), flush=True)
    ratios = [h / t for h, t in zip(h_rates, t_rates, strict=True)]
    ratio = common.median(ratios)
    met = ratio >= GOAL
    table = common.Table(f"DDP {nprocs} workers: harness vs torchrun (median (min–max) over pairs)",
                         ["launcher", "img/s", "command → first iteration s", "harness/torchrun img/s",
                          f"goal ≥ {GOAL}"])
    table.add("run.py strategy=ddp", common.fmt_spread(h_rates, 1), common.fmt_spread(h_start, 2),
              common.fmt_spread(ratios, 3), "met" if met else "missed")
    table.add("torchrun + plain DDP script", common.fmt_spread(t_rates, 1), common.fmt_spread(t_start, 2), "", "")
    table.print()
    extra = common.median(h_start) - common.median(t_start)
    print(f"the harness's own command_startup_seconds: {common.fmt_spread(h_own_start, 2)}", flush=True)
    print(guard.summary(), flush=True)
    if args.write_results:
        lines = [f"- Throughput harness/torchrun = {ratio:.3f} (median of {repeats} pairs) — goal ≥ {GOAL} "
                 f"{common.verdict(met)}.",
                 f"- Command to first iteration: harness {common.median(h_start):.2f} s, torchrun "
                 f"{common.median(t_start):.2f} s ({extra:+.2f} s). The harness's own `command_startup_seconds` "
                 f"for the same runs: {common.fmt_spread(h_own_start, 2)} s.", "",
                 "The plain script is `plain_ddp_worker` in `bench/ddp_vs_torchrun.py`, started as "
                 f"`torchrun --standalone --nproc-per-node={nprocs} bench/ddp_vs_torchrun.py --worker ...` with "
                 f"OMP_NUM_THREADS={threads} and GLOO_SOCKET_IFNAME=lo, as the harness sets for its workers. "
                 + guard.summary() + "."
                 + (f" The torchrun comparator itself failed {len(comparator_failures)} time(s) (a worker killed by "
                    "SIGABRT) and was started again." if comparator_failures else ""), *NOTES]
        body = common.results_page("ddp_vs_torchrun", settings, [table], lines)
        common.write_results("ddp_vs_torchrun", body, args.results_dir)
    return 0


NOTES = [
    "",
    "What differs on the harness's side: the workers run the same trainer loop as every strategy (nothing per "
    "iteration beyond a few Python calls); the launcher process additionally runs the memory sampler, whose "
    "wake-ups preempt one of the two single-threaded workers on a 2-core machine while the other waits at the "
    "next all-reduce (see [benchmark 2](sampler.md)). The spread of the ratio is this "
    "VM's run-to-run drift (see [benchmark 4](timing_fidelity.md)'s coefficient of variation); the median is the estimate. Startup: before "
    "the rendezvous `run.py` lets Hydra compose and validates the config and imports the runner (torch, the "
    "elastic launcher), and every spawned worker re-imports `run.py` (Hydra, OmegaConf) as multiprocessing's "
    "`__main__` before unpickling its entry point; torchrun only imports torch.distributed before starting "
    "`python script.py` twice.",
]


if __name__ == "__main__":
    sys.exit(main())
