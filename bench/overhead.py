"""Harness overhead: the harness's `strategy=single` run against a bare hand-written PyTorch loop doing the
same work (same model class, seed, batch, SGD settings, threads, iterations, warm-up exclusion).

    python bench/overhead.py [--models resnet18,tiny_cnn] [--write-results]

Two comparisons, both alternating A B, B A, ...:

1. In one process (the precise figure). A fresh process composes the config from conf/ exactly as
   `run.py` would and then alternates `harness.launch.runner.execute` (what `run.py strategy=single` runs after
   Hydra has composed: inline rank, memory sampler on at its default 100 ms, window clock, results file)
   with `bare_loop` below, many short times. Same interpreter state, same thread pool, neighbouring
   seconds: the machine's slow drifts fall on both sides.
2. As a user types it: `run.py strategy=single ...` and the bare loop, each a fresh process. This includes
   process-to-process variation, which on a shared VM is several percent; it is the check, not the figure.

Reported: harness/bare steady-state throughput, median and min–max over pairs. Goal: >= 0.99.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import common

GOAL = 0.99
# Per model: image size, batch, (iterations, log_every, pairs) in one process, and the same for run.py in fresh
# processes. resnet18 runs the CPU-sized default workload; the tiny model runs 8 px images in batches of 8, a
# sub-millisecond iteration, where anything the harness adds per iteration shows most.
SETTINGS = {"resnet18": {"size": 32, "batch": 32, "inprocess": (60, 10, 12), "subprocess": (120, 20, 3)},
            "tiny_cnn": {"size": 8, "batch": 8, "inprocess": (2000, 250, 12), "subprocess": (4000, 500, 3)}}
OTHER = {"size": 32, "batch": 32, "inprocess": (60, 10, 12), "subprocess": (120, 20, 3)}


def make_model(name: str, num_classes: int) -> Any:
    """The same model the harness builds for `model=NAME` (conf/model/NAME.yaml)."""
    if name == "tiny_cnn":
        from harness.rank.models import TinyCNN

        return TinyCNN(num_classes, width=8)
    import torchvision

    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


def bare_loop(w: dict[str, Any]) -> list[float]:
    """The comparator: a plain PyTorch training loop, timed with time.perf_counter at the same edges."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(w["threads"])
    torch.manual_seed(w["seed"])
    model = make_model(w["model"], w["num_classes"])
    optimizer = torch.optim.SGD(model.parameters(), lr=w["lr"], momentum=w["momentum"])
    generator = torch.Generator().manual_seed(w["seed"])
    images = torch.randn(w["batch_size"], 3, w["image_size"], w["image_size"], generator=generator)
    labels = torch.randint(0, w["num_classes"], (w["batch_size"],), generator=generator)
    model.train()
    edges = [time.perf_counter()]
    for it in range(1, w["iterations"] + 1):
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if it % w["log_every"] == 0:
            loss.item()
            edges.append(time.perf_counter())
    return [b - a for a, b in zip(edges, edges[1:], strict=False)]


def harness_overrides(model: str, iterations: int, log_every: int, size: int, batch: int) -> list[str]:
    return ["strategy=single", "amp=O0", f"model={model}", f"data.image_size={size}", f"batch_size={batch}",
            f"iterations={iterations}", f"log_every={log_every}"]


def bare_settings(model: str, iterations: int, log_every: int, threads: int, size: int, batch: int) -> dict[str, Any]:
    return {"model": model, "iterations": iterations, "log_every": log_every, "threads": threads,
            "batch_size": batch, "image_size": size,
            **{k: v for k, v in common.CPU_WORKLOAD.items() if k not in ("image_size", "batch_size")}}


def inprocess_worker(w: dict[str, Any]) -> dict[str, Any]:
    """Alternate the harness (in this process) and the bare loop, `pairs` times; ratios per pair."""
    overrides = harness_overrides(w["model"], w["iterations"], w["log_every"], w["image_size"], w["batch_size"])
    cfg = common.compose_config(overrides)
    bare = bare_settings(w["model"], w["iterations"], w["log_every"], w["threads"], w["image_size"], w["batch_size"])
    images = w["batch_size"] * w["log_every"]
    guard = common.Guard(**w["guard"])
    pairs, records = [], []
    for pair in range(w["pairs"]):
        def harness(pair: int = pair) -> float:
            return float(common.execute_in_process(cfg, Path(w["work"]) / f"inproc-{w['model']}-{pair}")
                         ["throughput_img_s"])

        def plain() -> float:
            return common.steady_throughput(bare_loop(bare), images, 1)

        order = [harness, plain] if pair % 2 == 0 else [plain, harness]
        done = guard.round(order, label=f"    in-process pair {pair + 1}")
        h, b = done.results if pair % 2 == 0 else done.results[::-1]
        pairs.append((h, b))
        records.append(common.Guard.round_record(done))
        print(f"    in-process pair {pair + 1}/{w['pairs']}: harness {h:.1f}, bare {b:.1f} img/s, ratio {h / b:.4f}"
              + ("" if done.clean else " *"), flush=True)
    return {"pairs": pairs, "rounds": records}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,tiny_cnn")
    parser.add_argument("--pairs", type=int, default=None, help="in-process pairs per model (default 12)")
    parser.add_argument("--process-pairs", type=int, default=None, help="run.py pairs per model (default 3)")
    parser.add_argument("--bare-worker", help=argparse.SUPPRESS)  # internal: JSON settings of one bare run
    parser.add_argument("--inprocess-worker", help=argparse.SUPPRESS)  # internal: JSON settings
    args = common.parse_args(parser, argv)
    if args.bare_worker:
        settings = json.loads(args.bare_worker)
        Path(settings["out"]).write_text(json.dumps({"windows": bare_loop(settings)}))
        return 0
    if args.inprocess_worker:
        settings = json.loads(args.inprocess_worker)
        Path(settings["out"]).write_text(json.dumps(inprocess_worker(settings)))
        return 0

    models = ["tiny_cnn"] if args.quick else [m for m in args.models.split(",") if m]
    threads = common.cores()
    env = common.pinned_env(threads)
    guard = common.guard_from(args)
    settings = {"threads per process": threads, "OMP_NUM_THREADS": env["OMP_NUM_THREADS"],
                "image size / batch": ", ".join(f"{m} {SETTINGS.get(m, OTHER)['size']} px / "
                                                 f"{SETTINGS.get(m, OTHER)['batch']}" for m in models),
                "warm-up windows excluded": 1, "memory sampler (harness)": "on, 100 ms (default)",
                "order": "A B, B A, ..."}
    common.print_settings("Harness overhead: the harness's strategy=single vs a bare PyTorch loop", settings)
    table = common.Table("harness overhead (steady-state throughput harness / bare; median (min–max) over pairs)",
                         ["model", "comparison", "pairs", "harness img/s", "bare img/s", "harness / bare",
                          "goal ≥ 0.99"])
    verdicts = []
    with common.runs_dir(args, "overhead") as work:
        for model in models:
            size, batch = SETTINGS.get(model, OTHER)["size"], SETTINGS.get(model, OTHER)["batch"]
            # 1. in one process
            iterations, log_every, pairs = (20, 10, 2) if args.quick else SETTINGS.get(model, OTHER)["inprocess"]
            pairs = args.pairs or pairs
            out = work / f"inprocess-{model}.json"
            worker = {"model": model, "iterations": iterations, "log_every": log_every, "threads": threads,
                      "image_size": size, "batch_size": batch, "pairs": pairs, "work": str(work), "out": str(out),
                      "guard": common.guard_to_dict(guard)}
            print(f"  {model}: in one process, {pairs} pairs of {iterations} iterations", flush=True)
            data, _ = common.run_json([common.python(), Path(__file__).resolve(), "--inprocess-worker",
                                       json.dumps(worker)], out, env, timeout_s=3600, echo="    ")
            guard.absorb(data["rounds"])
            h_rates = [h for h, _ in data["pairs"]]
            b_rates = [b for _, b in data["pairs"]]
            ratios = [h / b for h, b in data["pairs"]]
            ratio = common.median(ratios)
            met = ratio >= GOAL
            table.add(f"{model} ({size} px, batch {batch})", f"one process, {iterations} it (every {log_every})", pairs,
                      common.fmt_spread(h_rates, 1), common.fmt_spread(b_rates, 1), common.fmt_spread(ratios, 3),
                      "met" if met else "missed")
            verdicts.append(f"- {model}: harness/bare = {ratio:.3f} (median of {pairs} in-process pairs) — goal ≥ "
                            f"{GOAL} {common.verdict(met)}.")

            # 2. fresh processes, as typed
            iterations, log_every, pairs = (20, 10, 1) if args.quick else SETTINGS.get(model, OTHER)["subprocess"]
            pairs = args.process_pairs or pairs
            print(f"  {model}: fresh processes, {pairs} pairs of {iterations} iterations", flush=True)
            ratios, h_rates, b_rates = [], [], []
            for pair in range(pairs):
                tag = f"{model}-{pair}"

                def harness(tag: str = tag, model: str = model, iterations: int = iterations,
                            log_every: int = log_every, size: int = size, batch: int = batch) -> float:
                    run = common.run_harness(harness_overrides(model, iterations, log_every, size, batch),
                                             work / f"harness-{tag}", env)
                    return run.throughput

                def bare(tag: str = tag, model: str = model, iterations: int = iterations,
                         log_every: int = log_every, size: int = size, batch: int = batch) -> float:
                    out = work / f"bare-{tag}.json"
                    worker = {**bare_settings(model, iterations, log_every, threads, size, batch), "out": str(out)}
                    data, _ = common.run_json([common.python(), Path(__file__).resolve(), "--bare-worker",
                                               json.dumps(worker)], out, env)
                    return common.steady_throughput(data["windows"], batch * log_every, 1)

                order = [harness, bare] if pair % 2 == 0 else [bare, harness]
                done = guard.round(order, label=f"    run.py pair {pair + 1}")
                h, b = done.results if pair % 2 == 0 else done.results[::-1]
                print(f"    run.py pair {pair + 1}/{pairs}: harness {h:.1f}, bare {b:.1f} img/s, ratio {h / b:.4f}"
                      + ("" if done.clean else " *"), flush=True)
                ratios.append(h / b)
                h_rates.append(h)
                b_rates.append(b)
            ratio = common.median(ratios)
            table.add(f"{model} ({size} px, batch {batch})", f"fresh processes (run.py), {iterations} it (every {log_every})",
                      pairs,
                      common.fmt_spread(h_rates, 1), common.fmt_spread(b_rates, 1), common.fmt_spread(ratios, 3),
                      "met" if ratio >= GOAL else "missed")
            verdicts.append(f"  - as typed (`run.py`, fresh processes): {ratio:.3f} (median of {pairs} pairs, "
                            f"min–max {min(ratios):.3f}–{max(ratios):.3f}).")
    table.print()
    print(guard.summary(), flush=True)
    if args.write_results:
        lines = [*verdicts, "",
                 "In one process: a fresh process composes the config from `conf/` as `run.py` does, then alternates "
                 "`harness.launch.runner.execute` (exactly what `run.py strategy=single` runs after composing: inline rank, "
                 "memory sampler on at 100 ms, window clock, results file) with the ~20-line `bare_loop` of "
                 "`bench/overhead.py` (same model class, seed, batch, SGD settings, threads and warm-up exclusion, "
                 "windows timed with `time.perf_counter`). Fresh processes: `run.py` as typed against the bare loop "
                 "in its own process. " + guard.summary() + ".", *NOTES]
        body = common.results_page("overhead", settings, [table], lines)
        common.write_results("overhead", body, args.results_dir)
    return 0


NOTES = [
    "",
    "Reading these figures: identical runs on this VM drift by 5–15 % over tens of seconds (invisible to steal "
    "time and to the background-load check: it is the host), which is more than the 1 % being measured. The "
    "medians of many short alternating pairs in one process are the best estimate; the fresh-process pairs can "
    "land on either side of 1 for the same reason. The one cost found is the memory sampler thread, which runs "
    "inside the training process for `strategy=single` ([benchmark 2](sampler.md) measures it alone, with the reason). The rest of the harness adds nothing per "
    "iteration but a few Python calls (`before_step`, `forward_context`, `amp.backward/step/zero_grad`: under "
    "0.3 µs each, measured in [benchmark 8](hook_cost.md)) next to a sub-millisecond iteration.",
]


if __name__ == "__main__":
    sys.exit(main())
