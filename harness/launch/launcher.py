"""Start one worker per device with torch.distributed.elastic, the engine behind torchrun.

Everything listens on loopback only. torch's TCPStore servers bind every interface, so the one
store of a run is created here on a socket bound to 127.0.0.1 and everything else reuses it: the
c10d rendezvous (same port, multi-tenant) and, through the `c10d-loopback` rendezvous handler,
the store the workers bootstrap their process group from. gloo and NCCL's bootstrap are pinned to the
loopback interface.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as handler_registry
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, create_handler
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from harness.core.devices import Placement

LOOPBACK = "127.0.0.1"
SHUTDOWN_GRACE_S = 10  # SIGTERM to SIGKILL: time for surviving workers to write their records
# The elastic agent's own handler for SIGINT/SIGTERM raises on every signal, a second one too (in the middle of
# its logging or of its wait for the workers to end); the launcher's handler (runner._signals_as_interrupt)
# raises once and stops the run the same way (the agent's `finally` ends the workers with SIGTERM). torch's
# LaunchConfig has `signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"` (torchrun's --signals_to_handle),
# which launch_agent passes on as `os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle`
# for PContext.start() to register. (A torch without the field keeps its own handler: runner.execute still
# takes its SignalException as an interrupt.)
AGENT_SIGNALS = "SIGHUP,SIGQUIT"

logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)


@dataclass(frozen=True)
class WorkerFailure:
    rank: int
    pid: int | None
    exitcode: int
    message: str


def loopback_interface() -> str:
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == LOOPBACK for a in addresses):
            return name
    return "lo"


def loopback_env() -> dict[str, str]:
    """gloo and NCCL bootstrap over loopback: NCCL would not pick `lo` while other interfaces exist."""
    interface = loopback_interface()
    return {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface, "MASTER_ADDR": LOOPBACK}


@contextlib.contextmanager
def loopback_store(timeout_s: float) -> Iterator[int]:
    """A TCPStore server on 127.0.0.1 only; the rendezvous (multi-tenant, same port) reuses it."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((LOOPBACK, 0))
    listener.listen()
    port = listener.getsockname()[1]
    # The store's server takes ownership of the socket and closes it when it goes.
    store = dist.TCPStore(LOOPBACK, port, is_master=True, multi_tenant=True, wait_for_workers=False,
                          master_listen_fd=listener.detach(), timeout=timedelta(seconds=timeout_s))
    try:
        yield port
    finally:
        del store


class _LoopbackRendezvous(DynamicRendezvousHandler):
    """torch's c10d rendezvous, except that the workers' bootstrap store is the loopback store
    (torch would open a second server, on every interface, for them)."""

    def get_backend(self) -> str:
        return "c10d-loopback"

    def _create_tcp_store_server(self, master_addr: str, master_port: int) -> dist.TCPStore:
        port = int(self._loopback_endpoint.rpartition(":")[2])
        return dist.TCPStore(LOOPBACK, port, is_master=True, multi_tenant=True)  # the existing server


def _loopback_rendezvous(params: RendezvousParameters) -> RendezvousHandler:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

    backend, store = create_backend(params)  # joins the loopback server already listening on the port
    handler = create_handler(store, backend, params)  # parses timeouts etc. exactly as torchrun does
    handler.__class__ = _LoopbackRendezvous
    handler._loopback_endpoint = params.endpoint
    return handler


handler_registry.register("c10d-loopback", _loopback_rendezvous)


@contextlib.contextmanager
def patched_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Workers inherit the parent's environment at spawn; set theirs for the launch only."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def launch_workers(entry: Callable[[dict[str, Any]], Any], spec: dict[str, Any], placement: Placement,
                   start_timeout_s: float, log_dir: str, method: str = "elastic",
                   start_method: str = "spawn") -> list[WorkerFailure]:
    """Run `entry(spec)` on every rank; return the ranks that failed (empty when all succeeded).

    `method`: "elastic" (torchrun's engine: an agent that monitors, rendezvous, error files) or
    "spawn" (torch.multiprocessing.start_processes with `start_method`, the tutorials' way).
    On SIGINT/SIGTERM every worker is stopped before the signal's exception propagates.
    """
    if start_method == "forkserver":
        preload_forkserver()
    with loopback_store(start_timeout_s) as port:
        env = {**placement.worker_env, **loopback_env()}
        with patched_environ(env):
            if method == "spawn":
                return _spawn(entry, spec, placement.nprocs, port, start_method, env)
            return _elastic(entry, spec, placement.nprocs, port, start_timeout_s, log_dir, start_method, env)


# What the fork server imports once, before it forks any worker: each run still gets processes of its own
# (forked from a server that has run nothing), without paying torch's import (seconds) for every worker.
# (torchvision too: harness.rank.models imports it only when a torchvision model is built, 1.5 s a process;
# torch._dynamo, which torch.optim imports at the first optimizer a rank builds, 1.2 s a process on this CPU)
FORKSERVER_PRELOAD = ["harness.launch.launcher", "harness.rank.worker", "harness.rank.models", "torchvision",
                      "torch._dynamo"]


def preload_forkserver() -> None:
    """Takes effect when the server starts (the first forkserver launch of this process); later calls are
    no-ops. The server imports only: no thread, no CUDA context, no run's state is ever in it."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)


def in_worker_env(entry: Callable[[dict[str, Any]], Any], spec: dict[str, Any], env: Mapping[str, str]) -> Any:
    """A forked worker has the fork server's environment (from when the server started), not this run's: the
    run's variables (CUDA_VISIBLE_DEVICES, the loopback interface) are set here, before torch reads them."""
    os.environ.update(env)
    return entry(spec)


def _elastic(entry: Callable[[dict[str, Any]], Any], spec: dict[str, Any], nprocs: int, port: int,
             start_timeout_s: float, log_dir: str, start_method: str = "spawn",
             env: Mapping[str, str] | None = None) -> list[WorkerFailure]:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=uuid.uuid4().hex[:12],
        rdzv_backend="c10d-loopback", rdzv_endpoint=f"{LOOPBACK}:{port}",
        rdzv_configs={"is_host": True, "join_timeout": int(start_timeout_s)},
        max_restarts=0, monitor_interval=0.1, start_method=start_method, local_addr=LOOPBACK,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir), **_grace(LaunchConfig), **_agent_signals(LaunchConfig))
    try:
        elastic_launch(config, in_worker_env)(entry, spec, dict(env or {}))
    except ChildFailedError as error:
        return [WorkerFailure(rank=rank, pid=f.pid, exitcode=f.exitcode, message=_describe(f))
                for rank, f in sorted(error.failures.items())]
    finally:
        prune_empty(Path(log_dir))
    return []


def _grace(launch_config: type) -> dict[str, float]:
    """SIGTERM-to-SIGKILL grace for the agent, where this torch lets it be set (2.9, the XLA environment's
    torch, has no `shutdown_timeout` in LaunchConfig: its agent keeps its own)."""
    fields = {f.name for f in dataclasses.fields(launch_config)}
    return {"shutdown_timeout": SHUTDOWN_GRACE_S} if "shutdown_timeout" in fields else {}


def _agent_signals(launch_config: type) -> dict[str, str]:
    """The signals the agent handles itself, where this torch lets them be set (see AGENT_SIGNALS)."""
    fields = {f.name for f in dataclasses.fields(launch_config)}
    return {"signals_to_handle": AGENT_SIGNALS} if "signals_to_handle" in fields else {}


def prune_empty(folder: Path) -> None:
    """The agent makes logs/<run>/attempt_0/<rank>/ for every worker; keep only what holds a file (a failing
    worker's error.json), so a run folder shows no empty scaffolding."""
    if not folder.is_dir():
        return
    for path in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(path.iterdir()):
            path.rmdir()
    if not any(folder.iterdir()):
        folder.rmdir()


def _spawned_rank(local_rank: int, entry: Callable[[dict[str, Any]], Any], spec: dict[str, Any],
                  nprocs: int, port: int, env: Mapping[str, str]) -> None:
    """What torchrun would have put in the environment; every rank joins the parent's loopback store."""
    os.environ.update(env)
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(nprocs),
                      LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port),
                      TORCHELASTIC_USE_AGENT_STORE="True")
    entry(spec)


def _spawn(entry: Callable[[dict[str, Any]], Any], spec: dict[str, Any], nprocs: int, port: int,
           start_method: str, env: Mapping[str, str] | None = None) -> list[WorkerFailure]:
    """The first worker to fail ends the run: the others get SIGTERM at once (then SIGKILL after the grace
    period). torch's own ProcessContext.join(grace_period=g) would first wait g for them to exit by
    themselves, so the survivors of a failure went on training for g seconds."""
    import multiprocessing.connection
    import pickle

    import torch.multiprocessing as mp

    context = mp.start_processes(_spawned_rank, args=(entry, spec, nprocs, port, dict(env or {})), nprocs=nprocs, join=False,
                                 start_method=start_method)
    processes = context.processes
    waiting = {process.sentinel: rank for rank, process in enumerate(processes)}
    try:
        while waiting:
            for sentinel in multiprocessing.connection.wait(list(waiting)):
                rank = waiting.pop(sentinel)
                process = processes[rank]
                process.join()
                if process.exitcode == 0:
                    continue
                _stop(processes)
                message = f"exited with code {process.exitcode}"
                if process.exitcode < 0:
                    message = f"killed by {signal.Signals(-process.exitcode).name}"
                elif os.access(context.error_files[rank], os.R_OK):  # torch's wrapper pickled the traceback
                    with open(context.error_files[rank], "rb") as handle:
                        lines = [line for line in pickle.load(handle).strip().splitlines() if line.strip()]
                    message = lines[-1] if lines else message
                return [WorkerFailure(rank=rank, pid=process.pid, exitcode=process.exitcode, message=message)]
    except BaseException:
        _stop(processes)
        raise
    return []


def _stop(processes: list[Any]) -> None:
    """SIGTERM (the workers write their records), then SIGKILL after the grace period."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + SHUTDOWN_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def _describe(failure: Any) -> str:
    if failure.exitcode < 0:
        return f"killed by {failure.signal_name()}"
    message = failure.message if isinstance(failure.message, str) else str(failure.message)
    if not message or message == "<N/A>" or message.startswith("To enable traceback"):
        return f"exited with code {failure.exitcode} without a Python error"
    return message
