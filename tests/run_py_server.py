"""A test helper, not a test: `python run.py ARGS` for the suite, forked from this interpreter once it has imported
what run.py imports (torch, Hydra, the harness: 3 s of CPU a run, a third of a small run's, on the suite's two
cores). tests/conftest.py starts one a pytest worker and sends it one JSON line a run:

    {"argv": [...], "cwd": ..., "env": {...}, "affinity": [...] | null, "out": path, "err": path, "code": path,
     "new_session": bool}

Each run is a child of its own (in a session of its own where asked): its environment (PYTHONPATH on sys.path), folder
and CPU affinity the test's, stdout and stderr to the two paths (files, or named pipes the test reads as they come), torch's thread
count what a new interpreter would take from its CPUs, run.py executed as `__main__` (runpy) with argv as typed,
its end as an interpreter's (threads joined, exit handlers run: logging's flush, multiprocessing's children) and
its exit code written to `code` once it has ended (a signal: minus its number, as subprocess gives it). Nothing of
a run reaches the next one: each is a fork of this interpreter, which only imports. A test that needs a new
interpreter (what run.py does while it imports) starts one itself."""

from __future__ import annotations

import json
import os
import select
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# What `python run.py` imports before its first run, then what a run or a sweep imports later in that process:
# DTensor (a strategy's checks), pydantic (the records), the report and its plots (1 s of CPU a sweep)
PRELOAD = ("hydra", "torch", "harness.cli", "harness.launch.checked", "harness.launch.launcher", "harness.launch.runner",
           "harness.search.shortlist", "torch.distributed.tensor", "pydantic", "matplotlib.pyplot", "harness.report",
           "harness.report.plots")


def preload() -> None:
    """PRELOAD imported, as run.py would (CUDA's device order set first; matplotlib on Agg, as harness.report.plots
    sets it)."""
    import importlib

    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    sys.path.insert(0, REPO)
    import matplotlib

    matplotlib.use("Agg")
    for name in PRELOAD:
        importlib.import_module(name)
    sys.path.remove(REPO)


def run(request: dict, out: int, err: int) -> None:
    """In the forked child: become `python run.py ARGV` and exit as it would."""
    import atexit
    import runpy

    if request.get("new_session"):
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request.get("affinity") is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, request["affinity"])
    # torch took its thread count from this interpreter's CPUs (or OMP_NUM_THREADS) as it was imported: a new
    # interpreter pinned to one core would have one thread, not two spinning on it
    import torch

    from harness.launch.placement import usable_cores

    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else usable_cores())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd, target in ((1, out), (2, err)):
        os.dup2(target, fd)
        os.close(target)
    sys.argv = list(request["argv"])
    # as `python run.py` builds it: the script's folder first, then PYTHONPATH's entries, then the rest
    added = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:1] = [os.path.dirname(os.path.abspath(sys.argv[0])), *added]
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int) and stop.code is not None:
            print(stop.code, file=sys.stderr)
    except BaseException:  # what the interpreter would print on an uncaught exception
        import traceback

        traceback.print_exc()
        code = 1
    try:  # as the interpreter ends: its threads joined, then its exit handlers
        import threading

        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    preload()
    running: dict[int, str] = {}  # pid -> where its exit code goes
    requests = sys.stdin.buffer
    pending = b""
    while True:
        ready, _, _ = select.select([requests], [], [], 0.05)
        if ready:
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:  # the pytest worker has gone: so do we (runs still going are the tests' to end)
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                # opened here, before the reply: a named pipe the test reads has its writer from now on
                out, err = (os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                            for name in ("out", "err"))
                pid = os.fork()
                if pid == 0:
                    try:
                        run(request, out, err)
                    finally:  # never back into this loop, whatever failed before run.py started
                        os._exit(1)
                os.close(out)
                os.close(err)
                running[pid] = request["code"]
                print(json.dumps({"pid": pid}), flush=True)
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            path = running.pop(pid, None)
            if path is not None:
                with open(path + ".tmp", "w") as out:
                    out.write(str(os.waitstatus_to_exitcode(status)))
                os.replace(path + ".tmp", path)


if __name__ == "__main__":
    serve()
