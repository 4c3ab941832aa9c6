"""Report speed: `python -m harness.report` over 1,000 synthetic results.json files.

    python bench/report_speed.py [--files 1000] [--repeats 3] [--write-results]

The files follow the results contract (harness/launch/runner.py `planned` + `measured`, memory and env
sections included) with GPU-shaped devices and per-PID memory, so every part of the report has work to do.
Two layouts: "sweep" (200 combinations x 5 repeats: a large sweep, the common case) and "distinct" (every
file its own combination: the worst case, one table row and one plot line per file). Reported: wall time of
the CLI as a user runs it (interpreter start and imports included), median of the repeats, and where the
time goes inside `build_report`. Goal: under 5 s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import common

GOAL_S = 5.0
STRATEGIES = [("single", 1), ("dp", 2), ("ddp", 2), ("apex_ddp", 2), ("ddp", 4)]
AMPS = ("O0", "O1", "O2", "O3")
MODELS = ("resnet18", "resnet101")
BATCHES = (32, 64, 128, 256, 512)


def synthetic_results(index: int, strategy: str, ndev: int, amp: str, model: str, batch: int,
                      rng: random.Random) -> dict[str, Any]:
    """One results.json as the harness writes it for a run on `ndev` GPUs."""
    devices = [f"cuda:{i}" for i in range(ndev)]
    world = 1 if strategy in ("single", "dp") else ndev
    iterations, log_every = 100, 20
    per_iter = 0.002 * batch / world * rng.uniform(0.95, 1.05)
    windows, cumulative = [], 0.0
    for i in range(iterations // log_every):
        seconds = per_iter * log_every * (3.0 if i == 0 else rng.uniform(0.97, 1.03))
        cumulative += seconds
        windows.append({"end_iter": (i + 1) * log_every, "seconds": seconds, "cumulative_seconds": cumulative,
                        "warmup": i == 0, "loss": 6.9 / (i + 1)})
    steady = [w["seconds"] for w in windows[1:]]
    pids = [10_000 + 10 * index + r for r in range(world)]
    ranks = [{"rank": r, "local_rank": r, "pid": pids[r], "host": "node", "device": devices[r if world > 1 else 0],
              "status": "ok", "error": None, "allocator": []} for r in range(world)]
    per_device = [{"device": d, "peak_mib": rng.uniform(4000, 9000) * (1.3 if j == 0 and strategy == "dp" else 1),
                   "baseline_mib": 300.0} for j, d in enumerate(devices)]
    per_process = [{"pid": pids[min(j, world - 1)], "rank": min(j, world - 1), "device": d,
                    "peak_mib": per_device[j]["peak_mib"] - 300, "role": "rank", "host": "node"}
                   for j, d in enumerate(devices)]
    precision = {"level": amp, "impl": "apex" if strategy == "apex_ddp" else "native",
                 "dtype": "float32" if amp == "O0" else "float16", "master_weights": amp == "O2",
                 "keep_batchnorm_fp32": amp != "O3", "loss_scale": "dynamic" if amp in ("O1", "O2") else 1.0,
                 "final_loss_scale": 65536.0 if amp in ("O1", "O2") else 1.0, "skipped_steps": 0}
    cfg = {"strategy": {"name": strategy}, "amp": {"level": amp}, "model": {"name": model}, "batch_size": batch,
           "iterations": iterations, "log_every": log_every}
    return {
        "schema": 1, "status": "ok", "error": None, "strategy": strategy, "amp": amp, "model": model,
        "devices": devices, "accelerator": "cuda", "world_size": world, "nodes": 1, "global_batch": batch,
        "local_batch": batch // world, "image_size": 224, "iterations": iterations, "log_every": log_every,
        "warmup_windows": 1, "threads_per_process": 4, "notes": [], "precision": precision, "windows": windows,
        "per_rank_windows": {str(r): windows for r in range(world)},
        "throughput_img_s": batch * log_every * len(steady) / sum(steady), "startup_seconds": 6.0,
        "command_startup_seconds": 8.0, "ranks": ranks,
        "memory": {"source": "nvml", "samples": 120, "per_device": per_device, "per_process": per_process},
        "launcher_pid": 9_999, "overrides": [f"strategy={strategy}", f"amp={amp}"], "config": cfg,
        "env": {"torch": "2.x", "torch_built_for_cuda": "12.x", "python": "3.11", "hostname": "node", "platform": "Linux",
                "command": "python run.py -m", "driver": "550", "gpu_names": ["NVIDIA A100"] * ndev},
        "started_at": 1.7e9 + index, "finished_at": 1.7e9 + index + cumulative,
    }


def generate(root: Path, layout: str, count: int, seed: int = 0) -> list[Path]:
    rng = random.Random(seed)
    combos = [(s, n, a, m, b) for s, n in STRATEGIES for a in AMPS for m in MODELS for b in BATCHES]
    paths = []
    for i in range(count):
        if layout == "sweep":
            strategy, ndev, amp, model, batch = combos[i % len(combos)]
        else:  # every file its own row: a distinct batch size per file
            strategy, ndev, amp, model, _ = combos[i % len(combos)]
            batch = 4 * (i + 1)
        path = root / layout / f"{i // len(combos)}_{i:04d}_{strategy}_{amp}" / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(synthetic_results(i, strategy, ndev, amp, model, batch, rng), indent=2))
        paths.append(path)
    return paths


def stages(folder: Path, out: Path) -> dict[str, float]:
    """Where the time goes inside build_report, stage by stage (this process, modules already imported)."""
    from harness import report

    times: dict[str, float] = {}
    t = time.perf_counter()
    found, skipped = report.find_results([folder])
    times["read files"] = time.perf_counter() - t
    t = time.perf_counter()
    built = report.row_set(found)  # the rows and the fit the verdict decides on: built once, as compute() does
    rows = built.rows
    findings = report.of_rows(rows, built.baseline, skipped, fit=built.fit)
    times["rows"] = time.perf_counter() - t
    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    (out / "report.md").write_text(report.to_markdown(findings))
    report.write_csv(rows, out / "report.csv")
    times["md+csv"] = time.perf_counter() - t
    t = time.perf_counter()
    pngs = report.write_plots(rows, out)
    times["plots"] = time.perf_counter() - t
    t = time.perf_counter()
    (out / "index.html").write_text(report.to_html(findings, pngs))
    times["html"] = time.perf_counter() - t
    return times


def available() -> bool:
    return importlib.util.find_spec("harness.report") is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3, help="CLI runs of the sweep layout (default 3; distinct: 1)")
    parser.add_argument("--layouts", default="sweep,distinct")
    args = common.parse_args(parser, argv)

    count = 20 if args.quick else args.files
    repeats = 1 if args.quick else args.repeats
    layouts = ["sweep"] if args.quick else [x for x in args.layouts.split(",") if x]
    env = common.pinned_env(common.cores())
    settings = {"files": count, "layouts": ", ".join(layouts), "CLI runs": f"{repeats} (sweep), 1 (distinct)",
                "OMP_NUM_THREADS": env["OMP_NUM_THREADS"], "command": "python -m harness.report FOLDER --out DIR"}
    common.print_settings(f"Report speed: python -m harness.report over {count} results files", settings)
    guard = common.guard_from(args)
    table = common.Table(f"report over {count} synthetic results.json files",
                         ["layout", "rows", "CLI wall s (median (min–max))", "build_report stages s",
                          f"goal < {GOAL_S:g} s"])
    lines: list[str] = []
    if not available():
        print("harness.report not available yet: nothing to time (the files would be generated as below)",
              flush=True)
        for layout in layouts:
            table.add(layout, "—", "pending", "harness.report not available yet", "pending")
        table.print()
        if args.write_results:
            body = common.results_page("report_speed", settings, [table],
                                       ["Pending: `harness.report` is not in this checkout yet."])
            common.write_results("report_speed", body, args.results_dir)
        return 0

    with common.runs_dir(args, "report") as work:
        for layout in layouts:
            t = time.perf_counter()
            generate(work / "files", layout, count)
            print(f"  {layout}: {count} files written in {time.perf_counter() - t:.1f} s", flush=True)
            walls, rows = [], "?"
            runs = repeats if layout == "sweep" else 1  # the worst case takes long: once
            for r in range(runs):
                out = work / f"out-{layout}-{r}"

                def cli(out: Path = out, folder: Path = work / "files" / layout) -> common.Proc:
                    return common.run_command([common.python(), "-m", "harness.report", folder, "--out", out], env,
                                              timeout_s=600)

                proc = guard.round([cli], label=f"{layout} run {r + 1}").results[0]
                if proc.returncode != 0:
                    raise common.BenchError(f"harness.report exited {proc.returncode}\n{proc.tail()}")
                walls.append(proc.wall_s)
                data = json.loads((out / "report.json").read_text())
                rows = str(len(data["rows"]))
                print(f"  {layout} run {r + 1}/{runs}: {proc.wall_s:.2f} s, {rows} rows", flush=True)
            with common.measure_load():
                parts = stages(work / "files" / layout, work / f"stages-{layout}")
            breakdown = ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
            met = common.median(walls) < GOAL_S
            table.add(layout, rows, common.fmt_spread(walls, 2), breakdown, "met" if met else "missed")
            lines.append(f"- {layout} ({rows} rows): {common.median(walls):.2f} s — goal < {GOAL_S:g} s "
                         f"{common.verdict(met)}.")
    table.print()
    print(guard.summary(), flush=True)
    if args.write_results:
        lines += ["", "CLI wall time as a user sees it (interpreter start and imports included); the stage times "
                  "are `build_report`'s parts timed in one process after the CLI runs. " + guard.summary() + ".",
                  *NOTES]
        body = common.results_page("report_speed", settings, [table], lines)
        common.write_results("report_speed", body, args.results_dir)
    return 0


NOTES = [
    "",
    "Where the time goes: reading 1,000 files and building the rows take a fraction of a second; most of the rest "
    "is matplotlib (stage column). The report plots at most its top rows by throughput (`PLOT_ROWS` in "
    "harness/report.py) and keeps every row in report.md/csv/json, so the plots no longer grow with the sweep; "
    "before that cap, one legend entry, bar and label per row made 200 rows take ~6 s and 1,000 rows ~30 s here.",
]


if __name__ == "__main__":
    sys.exit(main())
