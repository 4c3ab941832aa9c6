"""Issue 6 end to end on CPU, with real worker processes: bad input refused before anything starts;
a rank raising, exiting or running out of memory, a worker SIGKILLed, Ctrl-C to the launcher (inline
and DDP runs, and a sweep); a sweep going on past a failed combination; run folders never touched or
overwritten; the report skipping unreadable results files. SIGTERM and the loopback-only rule:
tests/test_launcher.py.

Time bound asserted (generous: the machine may be shared): the launcher exits within STOP_BOUND_S
(conftest) of a rank failing, a worker being SIGKILLed, or SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    CLI_TIMEOUT_S,
    LONG_DDP_RUN,
    ONE_ROUND,
    REPO,
    RUN_PY,
    START_TIMEOUT_S,
    STOP_BOUND_S,
    TINY,
    LiveRun,
    alive_pids,
    check_stopped_by_signal,
    describe,
    is_alive,
    rank_spec,
    report_statuses,
    run_cli,
    run_pids,
    run_sweep,
)

from harness.cli import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_RUN_FAILED, group_options
from harness.core.config import OVERSUBSCRIBE_FACTOR
from harness.core.results import SCHEMA, RunRecord, from_dict
from harness.launch.placement import probe_hardware, usable_cores
from harness.launch.runner import SILENT_DEATH

# ---------------------------------------------------------------------------------------------------
# Bad input: one line naming the key, the bad value and what is allowed; exit 2; no worker; no folder.
# (amp=O4, amp.dtype, amp.impl=apex and batch_size=7 are in tests/test_cli.py.)
# ---------------------------------------------------------------------------------------------------

# A DDP run, so that a wrongly started run would show "[ddp O0] iter" lines and leave ranks/.
BASE = {"strategy": "ddp", "nprocs": "2", "model": "tiny_cnn", "data.image_size": "8", "batch_size": "8",
        "iterations": "40", "log_every": "20", "repeat": "1"}
GPU_BEYOND = max(probe_hardware().visible_gpus, default=-1) + 1  # 0 on a machine without GPUs
NPROCS_LIMIT = OVERSUBSCRIBE_FACTOR * usable_cores()

# case id: (overrides, fragments of the one error line; the first is `key=value`, right after "error: ")
BAD_INPUTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "unknown-strategy": (("strategy=nope",), ("strategy=nope", "one of " + ", ".join(group_options("strategy")))),
    "unknown-strategy-in-a-sweep": (("-m", "strategy=ddp,nope"), ("strategy=nope", "ddp", "single")),
    "unknown-amp-level-key": (("amp.level=O5",), ("amp.level=O5", "O0, O1, O2, O3")),
    "unknown-model": (("model=vgg",), ("model=vgg", "resnet18", "tiny_cnn")),
    "unknown-data": (("data=imagenet",), ("data=imagenet", "synthetic")),
    "gpus-duplicate": (("gpus=[0,0]",), ("gpus=[0,0]", "each GPU id at most once")),
    "gpus-negative": (("gpus=[-1]",), ("gpus=[-1]", "non-negative integer")),
    "gpus-fraction": (("gpus=[0.5]",), ("gpus=[0.5]", "non-negative integer")),
    "gpus-beyond-visible": ((f"gpus=[{GPU_BEYOND}]",), (f"gpus=[{GPU_BEYOND}]", "visible GPU")),
    # the reason said is the machine's where it has no GPU to give, else the empty list's
    "dp-with-no-gpus": (("strategy=dp", "gpus=[]"), ("gpus=[]", "strategy=dp runs on GPUs") if GPU_BEYOND else
                        ("strategy=dp", "needs CUDA GPUs and this machine has none")),
    "apex_ddp-with-no-gpus": (("strategy=apex_ddp", "gpus=[]"), ("gpus=[]", "strategy=apex_ddp runs on GPUs")
                              if GPU_BEYOND else ("strategy=apex_ddp", "needs CUDA GPUs and this machine has none")),
    "batch-zero": (("batch_size=0",), ("batch_size=0", "an integer >= 1")),
    "image-size-negative": (("data.image_size=-8",), ("data.image_size=-8", "an integer >= 1")),
    "iterations-below-log_every": (("iterations=10", "log_every=20"), ("iterations=10", "a multiple of log_every (20)")),
    "iterations-without-a-steady-window": (("iterations=20", "log_every=20"), ("iterations=20", "of at least 40")),
    "iterations-not-a-multiple": (("iterations=30",), ("iterations=30", "a multiple of log_every (20)")),
    "nprocs-zero": (("nprocs=0",), ("nprocs=0", "an integer >= 1")),
    "nprocs-far-beyond-cores": ((f"nprocs={NPROCS_LIMIT + 1}",),
                                (f"nprocs={NPROCS_LIMIT + 1}", f"1 to {NPROCS_LIMIT} on this machine")),
    "memory-interval-zero": (("memory.interval_ms=0",), ("memory.interval_ms=0", "> 0")),
    "budget-zero": (("-m", "timing.budget_s=0"), ("timing.budget_s=0", "a number > 0 (seconds a sweep")),
    "budget-text": (("-m", "timing.budget_s=abc"), ("timing.budget_s=abc", "a number")),
    "round-typed": (("-m", "round=2"), ("round=2", "left to the sweep")),
    "repeat-swept": (("-m", "repeat=1,3"), ("repeat=1,3", "one value")),
    # combinations that would run wrongly (GPU truth): refused the same way
    "dp-with-apex-patched-forward": (("strategy=dp", "amp=O2", "amp.impl=apex"), ("amp.impl=apex", "replica")),
    "apex_ddp-with-bfloat16-weights": (("strategy=apex_ddp", "amp=O3", "amp.dtype=bfloat16"),
                                       ("amp.dtype=bfloat16", "apex DDP reduces only half")),
}


def with_overrides(*overrides: str) -> list[str]:
    """BASE with `overrides` replacing its keys (Hydra refuses a key given twice)."""
    merged = dict(BASE)
    for override in overrides:
        key, _, value = override.partition("=")
        merged[key] = value
    return [f"{key}={value}" for key, value in merged.items()]


def assert_refused(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2 and exactly one line `error: KEY=VALUE is not allowed: WHAT IS`; nothing trained."""
    assert proc.returncode == EXIT_BAD_INPUT, describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, describe(proc)
    line = lines[0]
    assert line.startswith(f"error: {fragments[0]} is not allowed: "), line
    for fragment in fragments[1:]:
        assert fragment in line, (fragment, line)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert " iter " not in proc.stdout, describe(proc)  # no rank got as far as a window
    return line


def report_row(report: str, combination: str, *label_parts: str) -> str:
    """What report.md says of the one row whose label is `combination` (strategy amp) plus, when rows share it,
    the given `key=value` parts: "ok" when it is in the tables (rows that ran), else its entry in the list of
    what did not run ("failed: <reason>")."""
    said = report_statuses(report)
    found = [text for label, text in said.items() if label.split(" ")[:2] == combination.split(" ")
             and all(part in label.split(" ")[2:] for part in label_parts)]
    assert len(found) == 1, (combination, label_parts, report)
    return found[0]


def selected(request: pytest.FixtureRequest, test_name: str, param: str) -> list[Any]:
    """The values of `param` for which `test_name` is part of this session (to start only those runs)."""
    return [item.callspec.params[param] for item in request.session.items
            if getattr(item, "originalname", None) == test_name and hasattr(item, "callspec")]


THROUGH_THE_REAL_CLI = ("unknown-strategy", "unknown-strategy-in-a-sweep", "gpus-beyond-visible",
                        "dp-with-apex-patched-forward")  # the rest in this process: the same code, no start-up


@pytest.fixture(scope="module")
def refusals(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             ) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """The selected cases through the real CLI (conftest.RUN_PY), all at once."""
    root = tmp_path_factory.mktemp("refused")

    def refuse(case: str) -> tuple[str, tuple[subprocess.CompletedProcess[str], Path]]:
        argv, out_dir = argv_for(case), root / case
        dir_key = "hydra.sweep.dir" if "-m" in argv else "hydra.run.dir"
        proc = RUN_PY.run(["run.py", *argv, f"{dir_key}={out_dir}"], CLI_TIMEOUT_S)
        return case, (proc, out_dir)

    cases = selected(request, "test_bad_input_leaves_nothing_behind", "case")
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(refuse, cases))


def argv_for(case: str) -> list[str]:
    overrides, _ = BAD_INPUTS[case]
    multirun = overrides[:1] == ("-m",)
    return [*(["-m"] if multirun else []), *with_overrides(*overrides[multirun:])]


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_refused_before_anything_starts(case, capsys):
    from harness import cli

    with pytest.raises(SystemExit) as info:
        cli.precheck(argv_for(case))
    assert info.value.code == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert_refused(subprocess.CompletedProcess([], EXIT_BAD_INPUT, captured.out, captured.err),
                   *BAD_INPUTS[case][1])


@pytest.mark.slow
@pytest.mark.xdist_group("refusals")  # one worker starts them (each worker would start them all)
@pytest.mark.parametrize("case", THROUGH_THE_REAL_CLI)
def test_bad_input_leaves_nothing_behind(refusals, case):
    proc, out_dir = refusals[case]
    assert_refused(proc, *BAD_INPUTS[case][1])
    assert not out_dir.exists(), sorted(str(p) for p in out_dir.rglob("*"))  # no run folder, no ranks/


@pytest.mark.slow
def test_sweep_with_bad_input_is_refused_whole_and_missing_apex_is_a_skipped_row(tmp_path):
    """Bad input anywhere in a sweep: one line, exit 2, no sweep folder, before any combination runs.
    A combination whose optional package is missing: a row with its reason; the sweep goes on."""
    sweep = tmp_path / "sweep"
    base = ("strategy=single", "amp=O1", "amp.impl=apex", "model=tiny_cnn", "data.image_size=8", "iterations=20",
            "log_every=20", "warmup_windows=0")
    refused = run_sweep(*base, "batch_size=0,8", sweep_dir=sweep)
    assert refused.returncode == EXIT_BAD_INPUT and not sweep.exists(), describe(refused)
    assert refused.stderr.strip().splitlines() == ["error: batch_size=0 is not allowed: an integer >= 1"]
    proc = run_sweep(*base, "batch_size=4,8", sweep_dir=sweep)
    assert proc.returncode == 0, describe(proc)
    assert " iter " not in proc.stdout  # neither combination trained
    rows = {r["global_batch"]: r for r in map(json.loads, (p.read_text() for p in sweep.glob("*/results.json")))}
    assert sorted(rows) == [4, 8] and all(r["status"] == "skipped" and "apex" in r["error"] for r in rows.values())
    assert not list(sweep.glob("*/ranks")) and not list(sweep.glob("*/logs"))  # no worker started
    report = (sweep / "report.md").read_text()
    assert re.search(r"^skipped: .*apex", report_row(report, "single O1", "batch=8"))


@pytest.mark.slow
def test_sweep_records_an_incompatible_combination_as_skipped_with_its_reason(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_sweep("strategy=dp,single", "amp=O2", "amp.impl=apex", "model=tiny_cnn", "data.image_size=8",
                     "batch_size=8", "iterations=20", "log_every=20", "warmup_windows=0", sweep_dir=sweep)
    assert proc.returncode == 0, describe(proc)
    rows = {r["strategy"]: r for r in map(json.loads, (p.read_text() for p in sweep.glob("*/results.json")))}
    assert rows["dp"]["status"] == "skipped" and rows["dp"]["error"].startswith("amp.impl=apex is not allowed")
    assert "replica" in rows["dp"]["error"]
    assert rows["single"]["status"] == "skipped" and "apex" in rows["single"]["error"]  # not installed here


# ---------------------------------------------------------------------------------------------------
# No existing run folder touched, never another run's folder overwritten.
# ---------------------------------------------------------------------------------------------------

def run_folder(path: Path, finished: bool) -> dict[str, bytes | None]:
    """Make `path` look like another run's folder (finished: with its results.json; else its launcher was
    killed before writing it); return its snapshot."""
    for sub in (".hydra", "ranks", "logs"):
        (path / sub).mkdir(parents=True)
    files = {".hydra/config.yaml": "sentinel: true\n", ".hydra/hydra.yaml": "sentinel: true\n",
             ".hydra/overrides.yaml": "- sentinel=true\n", "ranks/rank0.json": '{"rank": 0, "sentinel": true}\n',
             "run.log": "sentinel\n"}
    if finished:
        files["results.json"] = json.dumps(RunRecord.not_run(status="failed", error="sentinel: another run's",
                                                             strategy="single", amp="O0", model="tiny_cnn").to_dict())
    for name, text in files.items():
        (path / name).write_text(text)
    return snapshot(path)


def snapshot(path: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under `path`."""
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}


@pytest.mark.slow
@pytest.mark.parametrize("finished", [
    pytest.param(True, id="finished-run"),
    pytest.param(False, id="run-killed-before-its-results"),
])
def test_bad_input_leaves_an_existing_run_folder_untouched(tmp_path, finished):
    """(A valid run pointed at a finished run's folder: tests/test_cli.py.)"""
    before = run_folder(tmp_path / "run", finished)
    proc, _ = run_cli(*with_overrides("batch_size=0"), tmp_path=tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT, describe(proc)
    assert len(proc.stderr.strip().splitlines()) == 1, describe(proc)
    assert snapshot(tmp_path / "run") == before


# ---------------------------------------------------------------------------------------------------
# Failures during a run: fault.kind=raise|exit|oom on rank 1 at iteration 30 of 60 (windows of 20).
# ---------------------------------------------------------------------------------------------------

FAULT_RUN = ("strategy=ddp", "nprocs=2", *TINY, "iterations=60", "log_every=20", "fault.rank=1", "fault.at_iter=30")
# kind: (status, what the run's error says after "rank 1 (pid N): ")
FAULTS = {
    "raise": ("failed", "RuntimeError: injected fault (fault.kind=raise) at iteration 30 on rank 1"),
    "exit": ("failed", "exited with code 13"),  # os._exit(13): no Python error, no record from that rank
    "oom": ("oom", "MemoryError: injected fault (fault.kind=oom) at iteration 30 on rank 1"),
}


@pytest.fixture(scope="module")
def fault_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The selected fault runs, started together (each is mostly process start-up); kind ->
    (process, results, run folder, time.time() when the launcher had exited)."""
    def run(kind: str) -> tuple[str, tuple[Any, ...]]:
        tmp = tmp_path_factory.mktemp(f"fault-{kind}")
        # exit under the user's default, spawn (raise under spawn: test_sweep_goes_on_past_a_failed_combination);
        # raise and oom from the fork server, a torch import instead of one a rank
        proc, results = run_cli(*FAULT_RUN, f"fault.kind={kind}", tmp_path=tmp, quick_start=kind != "exit")
        return kind, (proc, results, tmp / "run", time.time())

    kinds = selected(request, "test_injected_fault_ends_the_run_and_keeps_what_was_measured", "kind")
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(run, kinds))


@pytest.mark.slow
@pytest.mark.xdist_group("faults")  # one worker starts the three runs (each worker would start them all)
@pytest.mark.parametrize("kind", list(FAULTS))
def test_injected_fault_ends_the_run_and_keeps_what_was_measured(fault_runs, kind):
    proc, r, run_dir, exited_at = fault_runs[kind]
    status, message = FAULTS[kind]
    assert proc.returncode == EXIT_RUN_FAILED, describe(proc)
    assert r is not None, describe(proc)
    assert r["status"] == status, r["error"]
    # The root cause, not rank 0's "connection closed by peer" from the collective it was in.
    # (os._exit: the agent reports the exit code, or, when it found the neighbour's failure first, the rank
    # without a record is named all the same)
    said = (message, SILENT_DEATH) if kind == "exit" else (message,)
    assert re.fullmatch(r"rank 1 \(pid \d+\): .+", r["error"]) and any(m in r["error"] for m in said), r["error"]
    assert [w["end_iter"] for w in r["windows"]] == [20]  # the window finished before iteration 30 is kept
    ranks = {x["rank"]: x for x in r["ranks"]}
    if kind == "exit":
        assert 1 not in ranks  # died without writing a record
    else:
        assert ranks[1]["status"] == status and message in ranks[1]["error"]
    # The survivor stopped by its neighbour's failure (a broken collective) or the launcher's SIGTERM: its
    # record and the window it measured are never lost (signals are noted, not raised, so none can cut the
    # record's write short).
    assert ranks[0]["status"] in ("failed", "interrupted"), ranks[0]
    survivor = json.loads((run_dir / "ranks" / "rank0.json").read_text())
    assert [w["end_iter"] for w in survivor["windows"]] == [20], survivor

    # Time bound: the fault fired after the first window ended; the launcher was gone soon after.
    records = [json.loads(p.read_text()) for p in (run_dir / "ranks").glob("rank*.json")]
    fault_not_before = max(x["first_iter_time"] for x in records) + r["windows"][0]["cumulative_seconds"]
    took = exited_at - fault_not_before
    assert 0 < took < STOP_BOUND_S, f"launcher exited {took:.1f} s after the fault"
    print(f"\n{kind}: launcher exited {took:.2f} s after the fault")

    assert not alive_pids(run_pids(r)), "a worker outlived the launcher"
    if kind == "oom":  # the memory seen up to the failure is kept
        memory = r["memory"]
        assert memory["source"] == "psutil"
        assert sorted(p["rank"] for p in memory["per_process"]) == [0, 1], memory
        assert all(p["peak_mib"] > 0 for p in memory["per_process"]), memory
        devices = {d["device"]: d for d in memory["per_device"]}
        assert sorted(devices) == ["cpu:0", "cpu:1"] and devices["cpu:1"]["peak_mib"] > 0, memory


def test_a_sigterm_while_a_rank_writes_its_record_does_not_lose_it(tmp_path, monkeypatch):
    """Deterministic form of the race: SIGTERM lands inside write_json_atomic (here: during its fsync).
    What the rank measured must still reach ranks/rank0.json."""
    import harness.core.results
    from harness.core.stops import Interrupted
    from harness.rank.worker import run_rank

    record_dir = tmp_path / "ranks"
    spec = rank_spec(record_dir, "single", batch_size=4, iterations=40, gpus=[], nprocs=1)
    real_fsync = harness.core.results.os.fsync
    sent = []

    def fsync_then_sigterm(fd: int) -> None:
        real_fsync(fd)
        if not sent and record_dir.is_dir():  # the launcher stopping this rank, mid-write
            handler = signal.getsignal(signal.SIGTERM)
            assert handler not in (signal.SIG_DFL, None), "SIGTERM now would kill the rank mid-write"
            sent.append(handler)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(harness.core.results.os, "fsync", fsync_then_sigterm)
    previous, threads = signal.getsignal(signal.SIGTERM), torch.get_num_threads()
    try:
        try:
            run_rank(spec)  # installs the worker's SIGTERM handler, as in a launched rank
        except Interrupted:
            pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        torch.set_num_threads(threads)
    assert sent, "the record was never written"
    record = json.loads((record_dir / "rank0.json").read_text())
    assert [w["end_iter"] for w in record["windows"]] == [20, 40]


def test_only_the_first_stop_signal_interrupts_the_launcher():
    """A second SIGINT (`timeout -s INT` signals the process, then its group; a scheduler may signal twice)
    lands while the launcher stops the workers: it must not raise again inside that stop (in the elastic
    agent's logging it became a "--- Logging error ---" traceback; in its wait, workers stopped short), nor
    after it, while the results and a sweep's report are written."""
    from harness.core.stops import Interrupted
    from harness.launch import runner

    before = {s: signal.getsignal(s) for s in runner.STOP_SIGNALS}
    stopped: list[str] = []
    try:
        with pytest.raises(Interrupted, match="^stopped by SIGINT$"):
            with runner._signals_as_interrupt():
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(5)
                except Interrupted:
                    os.kill(os.getpid(), signal.SIGINT)  # the second, while the workers are being stopped
                    time.sleep(0.05)  # a handler runs at the next bytecode: it would raise here
                    stopped.append("workers stopped")
                    raise
        for sig in (signal.SIGINT, signal.SIGTERM):  # after the run: results and report being written
            handler = signal.getsignal(sig)
            assert handler not in (signal.SIG_DFL, signal.default_int_handler), f"{sig.name} now would end the report"
            os.kill(os.getpid(), sig)
            time.sleep(0.05)
        stopped.append("report written")
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert stopped == ["workers stopped", "report written"]


def test_the_elastic_agent_leaves_sigint_and_sigterm_to_the_launcher():
    """torch's agent would register its own SIGINT/SIGTERM handler, which raises on every signal."""
    from torch.distributed.launcher.api import LaunchConfig

    from harness.launch import launcher

    assert launcher._agent_signals(LaunchConfig) == {"signals_to_handle": "SIGHUP,SIGQUIT"}


@pytest.mark.slow
def test_worker_killed_with_sigkill_fails_the_run_within_the_bound(tmp_path):
    run_dir = tmp_path / "run"
    with LiveRun(*LONG_DDP_RUN, f"hydra.run.dir={run_dir}") as run:
        assert run.wait_for_output("[ddp O0] iter", START_TIMEOUT_S), run.describe()
        workers = run.workers()
        assert len(workers) == 2, workers
        victim = workers[1]  # started second: rank 1
        killed_at = time.time()
        victim.kill()
        code = run.wait(timeout=STOP_BOUND_S + 60)
    took = run.ended_at - killed_at
    assert code == EXIT_RUN_FAILED, run.describe()
    assert took < STOP_BOUND_S, f"launcher exited {took:.1f} s after SIGKILL"
    print(f"\nSIGKILL: launcher exited {took:.2f} s after the worker was killed")
    r = json.loads((run_dir / "results.json").read_text())
    assert r["status"] == "failed"
    # the agent names the killed rank (spawned workers) or, when the neighbour's broken connection is found
    # first (forked workers), the rank without a record is named all the same
    assert r["error"] in (f"rank 1 (pid {victim.pid}): killed by SIGKILL",
                          f"rank 1 (pid {victim.pid}): {SILENT_DEATH}"), r["error"]
    ends = [w["end_iter"] for w in r["windows"]]
    assert ends and ends == list(range(20, 20 * len(ends) + 1, 20)), ends  # the windows measured are kept
    assert [x["rank"] for x in r["ranks"]] == [0] and r["ranks"][0]["pid"] == workers[0].pid
    assert not [w.pid for w in workers if is_alive(w)], "a worker outlived the launcher"
    assert not run.survivors(grace=10)
    assert not alive_pids(run_pids(r))


@pytest.mark.slow
def test_ctrl_c_to_the_launcher_ends_every_worker(tmp_path):
    run_dir = tmp_path / "run"
    with LiveRun(*LONG_DDP_RUN, f"hydra.run.dir={run_dir}") as run:
        assert run.wait_for_output("[ddp O0] iter", START_TIMEOUT_S), run.describe()
        assert len(run.workers()) == 2
        sent = run.signal(signal.SIGINT)
        code = run.wait(timeout=STOP_BOUND_S + 60)
    r = check_stopped_by_signal(run, code, sent, signal.SIGINT, run_dir)
    assert sorted(p["rank"] for p in r["memory"]["per_process"]) == [0, 1]  # memory seen so far kept


@pytest.mark.slow
def test_ctrl_c_stops_a_run_inside_the_launcher(tmp_path):
    """strategy=single outside a sweep trains in the launcher itself: Ctrl-C still writes the results."""
    run_dir = tmp_path / "run"
    with LiveRun("strategy=single", *TINY, "iterations=100000", "log_every=20", f"hydra.run.dir={run_dir}") as run:
        assert run.wait_for_output("[single O0] iter", START_TIMEOUT_S), run.describe()
        sent = run.signal(signal.SIGINT)
        code = run.wait(timeout=STOP_BOUND_S + 60)
    r = check_stopped_by_signal(run, code, sent, signal.SIGINT, run_dir)
    assert r["error"] == "stopped by SIGINT"
    assert [(p["pid"], p["role"]) for p in r["memory"]["per_process"]] == [(r["launcher_pid"], "rank")]


# ---------------------------------------------------------------------------------------------------
# Sweeps: a failed combination is a row and the sweep goes on; Ctrl-C still writes the report.
# ---------------------------------------------------------------------------------------------------

def sweep_results(sweep: Path) -> dict[str, dict[str, Any]]:
    """Job folder name (0_ddp_O0, ...) -> its results."""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"))}




@pytest.mark.slow
def test_sweep_goes_on_past_a_failed_combination(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_sweep("strategy=ddp,single", "amp=O0", "nprocs=2", *TINY, "iterations=60", "log_every=20",
                     "fault.kind=raise", "fault.rank=1", "fault.at_iter=30", sweep_dir=sweep, timeout=2 * CLI_TIMEOUT_S,
                     quick_start=False)  # the user's default: spawn
    assert proc.returncode == 0, describe(proc)
    results = sweep_results(sweep)
    assert sorted(results) == ["0_ddp_O0", "1_single_O0"]  # ddp first: the sweep went on after it failed
    ddp, single = results["0_ddp_O0"], results["1_single_O0"]
    assert ddp["status"] == "failed" and ddp["error"].startswith("rank 1 (pid ") and "injected fault" in ddp["error"]
    assert [w["end_iter"] for w in ddp["windows"]] == [20]
    assert single["status"] == "ok" and [w["end_iter"] for w in single["windows"]] == [20, 40, 60]  # rank 0 only
    for r in results.values():
        assert not alive_pids(run_pids(r))
    report = (sweep / "report.md").read_text()
    assert report_row(report, "ddp O0") == "failed: " + ddp["error"]
    assert report_row(report, "single O0") == "ok"


@pytest.mark.slow
def test_ctrl_c_in_a_sweep_still_writes_the_report_of_what_finished(tmp_path):
    """SIGINT to the launcher's process alone (a scheduler's `kill -INT`), twice as `timeout -s INT` sends it
    (to the process, then to its group): the second lands while the first is being handled, and must neither
    break the stop (a "--- Logging error ---" traceback in the elastic agent's logging, the workers' wait cut
    short) nor leave a figure on the console that the report does not show."""
    sweep = tmp_path / "sweep"
    first = sweep / "0_single_O0_iterations-40" / "results.json"  # the folder names the swept setting
    with LiveRun("-m", "strategy=single", "amp=O0", *TINY, ONE_ROUND, "log_every=20", "iterations=40,100000,200000",
                 f"hydra.sweep.dir={sweep}") as run:
        # The first combination finished and the second is training.
        assert run.wait_until(lambda: first.exists() and "/100000 " in run.stdout, START_TIMEOUT_S), run.describe()
        sent = run.signal(signal.SIGINT)
        time.sleep(0.001)
        run.signal(signal.SIGINT)
        code = run.wait(timeout=STOP_BOUND_S + 60)
    assert code == EXIT_INTERRUPTED, run.describe()
    assert "Logging error" not in run.stderr and "Traceback" not in run.stderr, run.describe()
    status = [line for line in run.stdout.splitlines() if line.startswith("status ")]
    assert status[0].startswith("status ok · steady-state "), status  # the finished combination: its figure
    # the interrupted one: what it measured, no steady-state figure (the report times finished runs only)
    # as many windows as it reached before the signal: "1 window" or "N windows"
    assert re.search(r"\b\d+ windows? measured before it stopped, no steady-state figure", status[1]), status
    assert run.ended_at - sent < STOP_BOUND_S
    results = sweep_results(sweep)
    assert sorted(results) == ["0_single_O0_iterations-40", "1_single_O0_iterations-100000"]  # the third never started
    assert results["0_single_O0_iterations-40"]["status"] == "ok"
    interrupted = results["1_single_O0_iterations-100000"]
    assert interrupted["status"] == "interrupted" and interrupted["windows"]
    report = (sweep / "report.md").read_text()
    assert report_row(report, "single O0", "it=40") == "ok"
    assert report_row(report, "single O0", "it=100000").startswith("interrupted: ")
    # the verdict names what never started, and says the sweep was interrupted (rounds.json: it never ended)
    assert "Never started (the sweep was interrupted): single O0 iterations=200000." in report
    assert "it=200000" not in report
    assert not [p.pid for p in run.seen.values() if p.pid in run.worker_pids and is_alive(p)]
    assert not run.survivors(grace=10)
    for r in results.values():
        assert not alive_pids(run_pids(r))


def check_ctrl_c_in_the_terminal(run: LiveRun, sweep: Path) -> None:
    """Ctrl-C at the terminal: SIGINT to the whole process group (the launcher, the fork server, the calibration
    child, the ranks), as a shell sends it. Then: exit 130, a short line saying it was interrupted, no traceback
    from any of them, whatever ran recorded as finished or interrupted, and no process of the run left."""
    run.descendants()  # remembered, for the check that none is left
    os.killpg(run.proc.pid, signal.SIGINT)
    code = run.wait(timeout=STOP_BOUND_S + 60)
    assert code == EXIT_INTERRUPTED, run.describe()
    out = run.stdout + run.stderr
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, run.describe()
    said = [line for line in run.stderr.splitlines() if line.startswith("warning: interrupted")]
    assert said and all(len(line) < 120 for line in said), run.describe()
    statuses = [json.loads(path.read_text())["status"] for path in sweep.glob("*/results.json")]
    assert set(statuses) <= {"ok", "interrupted"}, statuses
    # the line saying a run's results are partial comes with that run's results, and only then
    assert ("partial results written" in out) == ("interrupted" in statuses), (statuses, run.describe())
    assert not statuses or (sweep / "report.md").is_file(), run.describe()  # what ran is reported, wherever it stopped
    assert not run.survivors(grace=10), run.survivors()


# never ends; predicted before the first run, as a user's sweep is (the tests' default skips it)
CTRL_C_SWEEP = ("-m", "strategy=single,ddp", *TINY, ONE_ROUND, "iterations=100000", "log_every=20", "plan.predict=true")


# A module whose body is interrupted, and which, like a C++ initialiser that an exception crosses (std::terminate,
# as torch's did in CI: Ctrl-C 1 s into a sweep, during `import torch`, exit -6), aborts if one reaches it.
ABORTS_IF_AN_EXCEPTION_CROSSES = """
import os, signal, time
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)
except BaseException:
    os.abort()
print("imported")
"""
OUTSIDE_AN_IMPORT = """
import os, signal, time
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(10)
finally:
    print("cleaned up")
"""


@pytest.mark.slow
@pytest.mark.parametrize("where", ["import", "outside"])
def test_ctrl_c_inside_an_import_is_raised_once_the_import_is_over(tmp_path, where):
    """Inside an import the interrupt waits for the import to end (nothing raised through what called it), then
    is raised where the program stands; elsewhere at once. Either way `finally` blocks run, one line, exit 130."""
    (tmp_path / "initialises.py").write_text(ABORTS_IF_AN_EXCEPTION_CROSSES)
    body = "import initialises\n    time.sleep(10)" if where == "import" else \
        OUTSIDE_AN_IMPORT.strip().replace("\n", "\n    ")
    program = ("import time\nfrom harness.core.stops import INTERRUPTED_BEFORE_RUNS, interrupt_ends_quietly\n"
               f"with interrupt_ends_quietly(INTERRUPTED_BEFORE_RUNS):\n    {body}\n    print('went on')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1])])}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_INTERRUPTED, (done.returncode, done.stderr)
    assert done.stderr.splitlines() == ["warning: interrupted before the first run started: nothing was run"]
    assert done.stdout.splitlines() == (["imported"] if where == "import" else ["cleaned up"])
    assert time.monotonic() - began < 9  # raised in the sleep after the import, not left to the block's end


@pytest.mark.slow
# 1 s lands in the imports; 3 and 8 s land in the phases the next test stops at by name (under -m bench)
@pytest.mark.parametrize("after_s", [1, *(pytest.param(s, marks=pytest.mark.bench) for s in (3, 8))])
def test_ctrl_c_at_any_moment_of_a_sweep_is_one_line_and_exit_130(tmp_path, after_s):
    """Issue 53: Ctrl-C in the first seconds (imports, composing, the pre-flight checks and predictions, Hydra's
    start-up, the first run) printed a 72-line KeyboardInterrupt traceback instead of one line."""
    sweep = tmp_path / "sweep"
    with LiveRun(*CTRL_C_SWEEP, f"hydra.sweep.dir={sweep}", new_interpreter=True) as run:  # its imports too
        time.sleep(after_s)
        check_ctrl_c_in_the_terminal(run, sweep)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["  predicted 1/", "[single O0] iter", "results: "])
def test_ctrl_c_at_each_phase_of_a_sweep_is_one_line_and_exit_130(tmp_path, moment):
    """The same, at a phase rather than a time: between two predictions, in a run (recorded as interrupted), and
    as the first job ends (between jobs, or in the next one's start)."""
    sweep = tmp_path / "sweep"
    overrides = CTRL_C_SWEEP if moment != "results: " else \
        ("-m", "strategy=single", *TINY, ONE_ROUND, "log_every=20", "iterations=40,100000")  # the first one ends
    with LiveRun(*overrides, f"hydra.sweep.dir={sweep}") as run:
        assert run.wait_for_output(moment, START_TIMEOUT_S), run.describe()
        check_ctrl_c_in_the_terminal(run, sweep)
        if moment == "[single O0] iter":
            assert [json.loads(p.read_text())["status"] for p in sweep.glob("*/results.json")] == ["interrupted"]


def test_an_interrupt_outside_a_run_is_one_line_and_exit_130(capsys):
    """What run.py wraps every phase in: a KeyboardInterrupt becomes the line it names and exit 130; a second
    Ctrl-C while exiting ends the process at once (no traceback from the exit either)."""
    from harness.core.stops import interrupt_ends_quietly

    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as ended, interrupt_ends_quietly("interrupted before it started"):
            raise KeyboardInterrupt
        assert ended.value.code == EXIT_INTERRUPTED
        assert capsys.readouterr().err == "warning: interrupted before it started\n"
        assert signal.getsignal(signal.SIGINT) not in (previous, signal.default_int_handler)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_surfacing_as_an_imports_error_is_still_the_interrupt(capsys):
    """A Ctrl-C landing inside numpy's C import surfaced as `ImportError: cannot load module more than once per
    process` (exit 1 and a traceback, in CI): an error after a Ctrl-C in the block is the interrupt; without one,
    an error is the error."""
    from harness.core.stops import interrupt_ends_quietly

    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as ended, interrupt_ends_quietly("interrupted before it started"):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler raises at the next bytecode
            except KeyboardInterrupt:
                raise ImportError("cannot load module more than once per process") from None
        assert ended.value.code == EXIT_INTERRUPTED
        assert capsys.readouterr().err == "warning: interrupted before it started\n"
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with pytest.raises(ImportError), interrupt_ends_quietly("interrupted before it started"):
            raise ImportError("a real one")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # its own handler taken back
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_that_python_drops_still_stops_the_next_run():
    """A Ctrl-C as a sweep's first job ended landed in a weakref callback (the garbage collector's), where Python
    drops the KeyboardInterrupt with an "Exception ignored" traceback: the next job ran to its end and the sweep
    never stopped (the Ctrl-C test timed out waiting). Now: nothing printed, the next run stops before it starts, and the block
    ends with the one line and exit 130 whatever swallowed it."""
    import weakref

    from harness.core.stops import Interrupted, ctrl_c_lost, interrupt_ends_quietly
    from harness.launch import runner

    class Held:
        pass

    def collected(_: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler raises here, inside the callback

    printed: list[Any] = []
    previous, previous_hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    sys.unraisablehook = printed.append  # what Python would print as "Exception ignored in ..."
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as ended, interrupt_ends_quietly("interrupted between runs"):
            held = Held()
            watch = weakref.ref(held, collected)
            assert not ctrl_c_lost()
            del held  # the callback runs: the Ctrl-C's KeyboardInterrupt is raised in it and dropped
            assert watch() is None and ctrl_c_lost()
            with pytest.raises(Interrupted, match="^stopped by SIGINT$"), runner._signals_as_interrupt():
                pass  # a run would start here
        assert ended.value.code == EXIT_INTERRUPTED and not printed
        assert not ctrl_c_lost()  # the block is over
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = previous_hook


def test_the_console_gives_no_steady_state_figure_to_a_run_that_did_not_finish():
    """The report times finished runs only; the console line said "steady-state 211.5 img/s" for an
    interrupted one, while the report beside it said no combination had run."""
    from harness.launch.console import status_line

    windows = [{"end_iter": i, "seconds": 1.0, "cumulative_seconds": i / 20, "warmup": i == 20} for i in (20, 40, 60)]
    ok = {"schema": SCHEMA, "strategy": "ddp", "amp": "O0", "model": "m", "status": "ok", "throughput_img_s": 211.5,
          "windows": windows, "error": None}
    assert status_line(from_dict(ok)) == "status ok · steady-state 211.5 img/s"
    stopped = {**ok, "status": "interrupted", "error": "stopped by SIGINT"}
    assert status_line(from_dict(stopped)) == ("status interrupted · 3 windows measured before it stopped, no "
                                               "steady-state figure · stopped by SIGINT")
    untimed = {**ok, "throughput_img_s": None, "windows": windows[:1]}  # parity=true: no steady window
    assert status_line(from_dict(untimed)) == "status ok"


# ---------------------------------------------------------------------------------------------------
# The report skips unreadable results files, naming them.
# ---------------------------------------------------------------------------------------------------

def minimal_ok_results() -> dict[str, Any]:
    windows = [{"end_iter": 20, "seconds": 0.2, "cumulative_seconds": 0.2, "warmup": True, "loss": 2.3},
               {"end_iter": 40, "seconds": 0.1, "cumulative_seconds": 0.3, "warmup": False, "loss": 2.1}]
    return from_dict({"schema": SCHEMA, "status": "ok", "error": None, "strategy": "single", "amp": "O0", "model": "tiny_cnn",
            "devices": ["cpu"], "world_size": 1, "nodes": 1, "global_batch": 8, "local_batch": 8, "image_size": 8,
            "iterations": 40, "log_every": 20, "windows": windows, "per_rank_windows": {"0": windows},
            "throughput_img_s": 1600.0, "startup_seconds": 1.0,
            "precision": {"level": "O0", "impl": "native", "dtype": "float32"},
            "ranks": [{"rank": 0, "pid": 4242, "device": "cpu", "status": "ok", "error": None}],
            "memory": {"source": "psutil", "per_device": [{"device": "cpu", "peak_mib": 300.0, "baseline_mib": 0.0}],
                       "per_process": [{"pid": 4242, "rank": 0, "device": "cpu", "peak_mib": 300.0, "role": "rank"}]}}
                     ).to_dict()  # complete, as the harness writes it


@pytest.mark.slow
def test_report_skips_an_unreadable_results_file_and_names_it(tmp_path):
    good = tmp_path / "0_single_O0" / "results.json"
    torn = tmp_path / "1_ddp_O0" / "results.json"
    good.parent.mkdir()
    torn.parent.mkdir()
    good.write_text(json.dumps(minimal_ok_results()))
    text = json.dumps({**minimal_ok_results(), "strategy": "ddp"})
    torn.write_text(text[: len(text) // 2])  # half-written
    proc = subprocess.run([sys.executable, "-m", "harness.report", str(tmp_path), "--out", str(tmp_path / "report")],
                          cwd=REPO, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, describe(proc)
    assert f"warning: skipping unreadable results file {torn}" in proc.stderr, describe(proc)
    assert str(good) not in proc.stderr
    report = (tmp_path / "report" / "report.md").read_text()
    assert report_row(report, "single O0") == "ok"
    assert "ddp O0" not in report
    assert f"- {torn}: " in report  # named under "Unreadable results files (skipped)"


@pytest.mark.slow
@pytest.mark.parametrize("when", ["mid-run", "after the loop"])
def test_a_launcher_killed_hard_leaves_no_process_of_its_run(tmp_path, when):
    """SIGKILL (a caller's time-out, the OOM killer) gives the launcher no chance to stop anyone: its ranks see it
    gone and stop themselves (SIGTERM to themselves: their records say why), SIGKILLed 10 s later if they hang;
    a rank that has written its record ends within dist.timeout_s whoever it waits for. Once, two FSDP ranks
    that had written their records sat in a futex wait for over an hour beside the fork server, 840 MB each."""
    run_dir = tmp_path / "run"
    iterations = "iterations=100000" if when == "mid-run" else "iterations=60"
    args = ("strategy=fsdp", "nprocs=2", *TINY, iterations, "log_every=20", "dist.timeout_s=20",
            "launcher.start_method=forkserver", f"hydra.run.dir={run_dir}")
    with LiveRun(*args) as run:
        assert run.wait_for_output("[fsdp O0] iter", START_TIMEOUT_S), run.describe()
        assert len(run.workers()) == 2
        if when == "after the loop":  # every rank has written its record: what is left is teardown
            assert run.wait_until(lambda: len(list((run_dir / "ranks").glob("rank*.json"))) == 2, 120), run.describe()
        run.descendants()
        killed_at = time.monotonic()
        os.kill(run.proc.pid, signal.SIGKILL)
        run.wait(timeout=30)
        left = [f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in run.survivors(grace=25)]
        took = time.monotonic() - killed_at
    assert not left, f"{left} outlived the launcher"
    assert took < 25, f"the run's processes took {took:.1f} s to end"
    records = [json.loads(p.read_text()) for p in sorted((run_dir / "ranks").glob("rank*.json"))]
    assert len(records) == 2  # nothing lost: each rank wrote what it measured
    if when == "mid-run":  # stopped by their own SIGTERM; a rank whose peer left mid-collective may fail instead
        assert all(r["status"] in ("interrupted", "failed") and r["error"] for r in records), records
        assert any(r["status"] == "interrupted" and "SIGTERM" in r["error"] for r in records), records
    else:
        assert all(r["status"] == "ok" for r in records)
    print(f"\nlauncher SIGKILLed {when}: every process of the run gone {took:.1f} s later")
