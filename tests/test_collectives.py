"""harness.collectives end to end (python -m harness.collectives: runner and entry point); the
modules' own tests are tests/test_collectives_<module>.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import REPO, describe

from harness.collectives.arithmetic import OPS, bus_factor


@pytest.mark.slow
def test_the_package_needs_nothing_of_the_training_command_line():
    """The benchmark's entry point imports neither harness.cli nor what only the CLI needs."""
    code = ("import sys, harness.collectives.__main__; "
            "print(sorted(m for m in sys.modules if m == 'harness.cli' or m.startswith('harness.cli.')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.strip() == "[]", proc.stdout


# ---- the real thing: 2 gloo workers, tiny sizes ----

@pytest.mark.slow
def test_benchmark_runs_with_two_workers(tmp_path):
    out = tmp_path / "coll"
    proc = subprocess.run([sys.executable, "-m", "harness.collectives", "nprocs=2", "gpus=[]",
                           "collectives.sizes=[4KiB,64KiB]", "collectives.warmup=1", "collectives.repeats=2",
                           f"hydra.run.dir={out}"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, describe(proc)
    results = json.loads((out / "collectives.json").read_text())
    assert results["status"] == "ok" and results["world_size"] == 2 and results["backend"] == "gloo"
    measured = {r["op"] for r in results["rows"]} | set(results["unsupported"])
    assert measured == set(OPS), results["unsupported"]
    for row in results["rows"]:
        assert row["size_bytes"] in (4096, 65536) and row["time_us"] > 0
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * bus_factor(row["op"], 2))
    table = (out / "collectives.md").read_text()
    assert "| all_reduce | 4 KiB | 4096 |" in table and "| sendrecv | 64 KiB | 65536 |" in table
    assert (out / "collectives.csv").read_text().startswith("op,size,")
    assert (out / "bandwidth.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / "results.json").exists()  # the strategy report must not mistake it for a run


@pytest.mark.slow
def test_one_rank_out_of_memory_stops_that_op_on_every_rank_without_a_hang(tmp_path):
    """Rank 1 alone runs out of memory at 64 KiB. Before: rank 1 went on to the next op while rank 0 ran
    the 64 KiB all_reduce, and both waited in different collectives until the timeout (120 s)."""
    out = tmp_path / "coll"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness.collectives", "nprocs=2", "gpus=[]",
                           "collectives.sizes=[4KiB,64KiB,256KiB]", "collectives.ops=[all_reduce,broadcast]",
                           "collectives.warmup=1", "collectives.repeats=2", "collectives.fault.rank=1",
                           "collectives.fault.size=64KiB", "dist.timeout_s=120", f"hydra.run.dir={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    assert proc.returncode == 0, describe(proc)
    assert took < 100, f"took {took:.0f} s: the ranks waited for each other until the collective timeout"
    results = json.loads((out / "collectives.json").read_text())
    for op in ("all_reduce", "broadcast"):
        assert [r["size_bytes"] for r in results["rows"] if r["op"] == op] == [4096]
        reason = results["unsupported"][op]
        assert reason.startswith("at 64 KiB: rank 1: OutOfMemoryError: injected fault"), reason


@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "coll"
    proc = subprocess.run([sys.executable, "-m", "harness.collectives", "collectives.ops=[all_reduce,nope]",
                           f"hydra.run.dir={out}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip().splitlines()[-1].startswith("error: collectives.ops=[all_reduce,nope] is not allowed")
    assert not out.exists()
