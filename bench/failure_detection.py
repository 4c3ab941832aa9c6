"""How soon the launcher stops the survivors when a worker dies: from a worker's death (SIGKILL, or an
exception) to the other worker's SIGTERM.

    python bench/failure_detection.py [--trials 10] [--write-results]

Two workers are started by the harness's own launcher (`harness.launch.launcher.launch_workers`, `elastic` and
`spawn`), running a small entry of this script instead of the trainer, so nothing but the launcher is
measured: rank 1 writes its PID and waits; rank 0 waits in a Python loop with a SIGTERM handler that notes
`time.time()` to a file. This script SIGKILLs rank 1 (or has it raise) and takes the time it did so;
rank 0's note says when its SIGTERM arrived. Same machine, same clock (time.time()), two processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common

from harness.core.devices import Placement
from harness.launch.launcher import launch_workers


def entry(spec: dict[str, Any]) -> None:
    """Rank 1: PID to a file, then wait (to be killed) or raise on request. Rank 0: note SIGTERM's arrival."""
    folder, rank = Path(spec["folder"]), int(os.environ["RANK"])
    if rank == 0:
        def note(signum: int, frame: object) -> None:
            (folder / "sigterm_at").write_text(repr(time.time()))
            os._exit(0)

        signal.signal(signal.SIGTERM, note)
        (folder / "rank0.ready").touch()  # its handler is in place: a death may now be timed
        while True:
            time.sleep(0.001)
    (folder / "rank1.pid").write_text(str(os.getpid()))
    while not (folder / "raise").exists():
        time.sleep(0.001)
    (folder / "raised_at").write_text(repr(time.time()))
    raise RuntimeError("rank 1 gives up")


def trial(method: str, death: str) -> float:
    """Seconds from rank 1's death to rank 0's SIGTERM."""
    placement = Placement(accelerator="cpu", gpus=(), torch_indices=(), nprocs=2, one_process_per_device=True,
                          devices=("cpu:0", "cpu:1"), threads_per_process=1, global_batch=2)
    with tempfile.TemporaryDirectory(prefix="bench-detect-") as tmp:
        folder = Path(tmp)
        thread = threading.Thread(target=launch_workers, daemon=True,
                                  args=(entry, {"folder": tmp}, placement, 60, str(folder / "logs"), method))
        thread.start()
        deadline = time.monotonic() + 120
        while not ((folder / "rank1.pid").exists() and (folder / "rank0.ready").exists()):
            if time.monotonic() > deadline:  # under load rank 0 may come up after rank 1: wait for both
                raise common.BenchError("the ranks never started")
            time.sleep(0.01)
        time.sleep(0.5)  # both ranks in their loops
        if death == "SIGKILL":
            died_at = time.time()
            os.kill(int((folder / "rank1.pid").read_text()), signal.SIGKILL)
        else:
            (folder / "raise").touch()
            while not (folder / "raised_at").exists():
                time.sleep(0.001)
            died_at = float((folder / "raised_at").read_text())
        thread.join(timeout=120)
        noted = folder / "sigterm_at"
        if not noted.exists():
            raise common.BenchError(f"{method}/{death}: rank 0 never got SIGTERM")
        return float(noted.read_text()) - died_at


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    args = common.parse_args(parser, argv)
    trials = 1 if args.quick else args.trials
    os.environ.update(common.pinned_env(1))  # the workers inherit it
    settings = {"workers": 2, "trials per case": trials, "launchers": "elastic (monitor interval 0.1 s), spawn",
                "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"], "clock": "time.time() in both processes"}
    common.print_settings("Failure detection: a worker's death to the survivor's SIGTERM", settings)
    table = common.Table("a worker's death to the other worker's SIGTERM (seconds)",
                         ["launcher", "death", "trials", "median", "min", "max"])
    found: dict[str, list[float]] = {}
    for method in ("elastic", "spawn"):
        for death in ("SIGKILL", "exception"):
            times = [trial(method, death) for _ in range(trials)]
            found[f"{method}/{death}"] = times
            table.add(method, death, str(trials), f"{statistics.median(times):.3f}", f"{min(times):.3f}",
                      f"{max(times):.3f}")
            print(f"  {method}, {death}: median {statistics.median(times):.3f} s, max {max(times):.3f} s", flush=True)
    table.print()
    print(json.dumps({k: [round(t, 4) for t in v] for k, v in found.items()}), flush=True)
    if args.write_results:
        elastic = found["elastic/SIGKILL"] + found["elastic/exception"]
        lines = [f"- elastic (the default): the survivor's SIGTERM came {statistics.median(elastic):.3f} s after the "
                 f"death (median of {len(elastic)}; at most {max(elastic):.3f} s): the agent polls its workers every "
                 "0.1 s (`monitor_interval`), then stops the others.",
                 "- spawn: the parent waits on the workers' process handles, so it sees a death at once; then it "
                 "stops the others.",
                 "",
                 "How it is measured: the launcher is the harness's own (`harness.launch.launcher.launch_workers`), the "
                 "workers run a small entry of this script (rank 0 notes when SIGTERM arrives, rank 1 is killed or "
                 "raises), so only the launcher's reaction is timed. Both times are `time.time()` on one machine."]
        body = common.results_page("failure_detection", settings, [table], lines)
        common.write_results("failure_detection", body, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
