"""Writes the sweep folders tests/test_verdict_replays.py replays: each reproduces, with throughputs set by hand,
a sentence a user read in a real sweep at 63d49a2 (issue 49), as results.json files and the sweep's rounds.json.

    python tests/data/verdict_replays/make.py   # rewrites the folders beside this file

Every run records its round, its place in the round and the combination run before it, in the orders the
rounds sweeper gives (a Williams design); what the report reads is set, the rest of a record its defaults."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.core.results import from_dict
from harness.verdict.rounds import balanced_order

HERE = Path(__file__).parent


def run(strategy: str, amp: str, number: int, rate: float | None, *, place: int, after: int | None,
        repeat: int | None, status: str = "ok", error: str | None = None, busy: bool = False,
        config: dict | None = None, overrides: list[str] | None = None, tokens: int | None = None) -> dict:
    every, seconds = 20, 32 * 20 / rate if rate else 1.0
    windows = [{"end_iter": every * (i + 1), "seconds": seconds, "cumulative_seconds": seconds * (i + 1),
                "warmup": i == 0, "loss": 2.0 - 0.1 * i} for i in range(3)] if status == "ok" else []
    return {"schema": 2, "status": status, "error": error, "strategy": strategy, "amp": amp,
            "model": "gpt" if tokens else "shufflenet_v2_x0_5", "devices": ["cpu:0", "cpu:1"] if strategy == "ddp" else ["cpu"],
            "world_size": 2 if strategy == "ddp" else 1, "global_batch": 32, "image_size": None if tokens else 32,
            "iterations": 60, "log_every": every, "launcher": "elastic/spawn",
            "precision": {"impl": "native", "dtype": "float32"}, "windows": windows,
            "throughput_img_s": rate if status == "ok" else None, "round": number, "place": place, "after": after,
            "tokens_per_sample": tokens, "sample": "tokens" if tokens else "images",
            "throughput_tokens_s": rate * tokens if tokens and rate else None,
            "machine": {"busy": busy, "reason": "others took 0.9 of 2 cores" if busy else None},
            "config": {"repeat": repeat, "verdict": {"margin": 0.05}, **(config or {})},
            "overrides": overrides or [f"strategy={strategy}", f"amp={amp}"]}


def sweep(name: str, combos: list[dict], rounds: int, repeat: int | None, command: str,
          planned: int | None = None, ended_by: str = "repeat") -> None:
    """`combos`: each {"strategy", "amp", "rates": per round (None: not timed), optional "busy": rounds, "status",
    "error", "config", "overrides", "tokens", "suffix"}."""
    folder = HERE / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    previous, orders = None, []
    for number in range(1, rounds + 1):
        order = balanced_order(list(range(len(combos))), number - 1)
        orders.append(order)
        for place, index in enumerate(order, start=1):
            c = combos[index]
            rate = c["rates"][number - 1]
            sub = f"{index}_{c['strategy']}_{c['amp']}{c.get('suffix', '')}"
            path = folder / (sub if number == 1 else f"round-{number}/{sub}")
            path.mkdir(parents=True)
            data = run(c["strategy"], c["amp"], number, rate, place=place, after=previous, repeat=repeat,
                       status=c.get("status", "ok"), error=c.get("error"), busy=number in c.get("busy", ()),
                       config=c.get("config"), overrides=c.get("overrides"), tokens=c.get("tokens"))
            (path / "results.json").write_text(json.dumps(from_dict(data).to_dict(), indent=1))
            previous = index
    plan = {"combinations": [c.get("overrides") or [f"strategy={c['strategy']}", f"amp={c['amp']}"] for c in combos],
            "names": [f"{c['strategy']} {c['amp']}{c.get('name', '')}" for c in combos], "repeat": repeat,
            "budget_s": 170.0, "margin": 0.05, "command": command, "planned": planned or rounds,
            "rounds_started": rounds, "busy_only": [], "ended_by": ended_by, "orders": orders,
            "round_seconds": [40.0] * rounds}
    (folder / "rounds.json").write_text(json.dumps(plan, indent=1))


def main() -> None:
    ok = {"status": "ok"}
    skipped = {"status": "skipped", "error": "strategy=dp: needs CUDA GPUs (this machine has none)"}
    # 1. `-m strategy=single,ddp,dp amp=O0,O1,O2,O3`, 4 rounds: single O1 is clearly slower than single O0, and
    #    single O3 is the pair still open (it said "leads single O1 by 1.25x [1.10-1.41]; no estimate ...")
    rows = [("single", "O0", [968, 1000, 940, 965]), ("single", "O1", [780, 790, 760, 775]),
            ("single", "O2", [600, 610, 590, 600]), ("single", "O3", [1000, 900, 1010, 930]),
            ("ddp", "O0", [400, 405, 398, 402]), ("ddp", "O1", [300, 305, 298, 302]),
            ("ddp", "O2", [350, 355, 348, 352]), ("ddp", "O3", [380, 385, 378, 382])]
    combos = [{"strategy": s, "amp": a, "rates": r, **ok} for s, a, r in rows]
    combos += [{"strategy": "dp", "amp": a, "rates": [None] * 4, **skipped} for a in ("O0", "O1", "O2", "O3")]
    sweep("open_pair", combos, 4, 4, "run.py -m strategy=single,ddp,dp amp=O0,O1,O2,O3 repeat=4")
    # 2. `-m model=gpt model.seq_len=64,128 strategy=fsdp`: 64 tokens a sample at about 686 samples/s (44,000
    #    tokens/s) against 128 at about 474 (60,600 tokens/s); it ranked 64 first by samples/s
    gpt = [{"strategy": "fsdp", "amp": "O0", "rates": r, "tokens": t, "config": {"model": {"seq_len": t}},
            "overrides": ["model=gpt", f"model.seq_len={t}", "strategy=fsdp"], "suffix": f"_seq_len-{t}",
            "name": f" model.seq_len={t}"} for t, r in ((64, [690, 680, 700, 675]), (128, [470, 480, 468, 476]))]
    sweep("tokens", gpt, 4, 4, "run.py -m model=gpt model.seq_len=64,128 strategy=fsdp repeat=4")
    # 3. The main job beside a busy machine, racing, 2 rounds: ddp O2 and single O1 each have one quiet run, in
    #    different rounds, and round 2 ran about 12 % faster; it said "Fastest measured: ddp O2, 686.7 img/s
    #    [70.2-6712.1], 0.95x single O1"
    busy = [("single", "O0", [500, 560], ()), ("single", "O1", [600, 720], (1,)), ("ddp", "O0", [300, 330], ()),
            ("ddp", "O2", [686.7, 600], (2,)), ("single", "O2", [400, 420], (1, 2)), ("ddp", "O1", [200, 210], (1, 2))]
    combos = [{"strategy": s, "amp": a, "rates": r, "busy": b, **ok} for s, a, r, b in busy]
    sweep("busy", combos, 2, None, "run.py -m", planned=2, ended_by="planned rounds")
    # 4. `-m repeat=3`: ddp's round-3 run was busy; it showed ddp "(stopped r2)" though it ran all three rounds
    combos = [{"strategy": "single", "amp": "O0", "rates": [900, 920, 910], **ok},
              {"strategy": "ddp", "amp": "O0", "rates": [700, 690, 705], "busy": (3,), **ok}]
    sweep("repeat_busy_last", combos, 3, 3, "run.py -m strategy=single,ddp repeat=3")


if __name__ == "__main__":
    main()
