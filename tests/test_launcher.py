"""harness.launch.launcher: during a single-machine run nothing listens outside the loopback interface
(127.0.0.0/8, ::1), and SIGTERM to the launcher ends every worker."""

from __future__ import annotations

import ipaddress
import signal
import socket
from collections.abc import Iterable

import psutil
import pytest
from conftest import LONG_DDP_RUN, START_TIMEOUT_S, STOP_BOUND_S, LiveRun, check_stopped_by_signal


def listening_sockets(processes: Iterable[psutil.Process]) -> set[tuple[int, str, str, int]]:
    """(pid, tcp|udp, address, port) of every listening TCP socket and every bound, unconnected UDP socket."""
    found = set()
    for process in processes:
        try:
            connections = process.net_connections(kind="inet")
        except psutil.Error:
            continue  # ended meanwhile
        for c in connections:
            if not c.laddr:
                continue
            if c.type == socket.SOCK_STREAM and c.status == psutil.CONN_LISTEN:
                found.add((process.pid, "tcp", c.laddr.ip, c.laddr.port))
            elif c.type == socket.SOCK_DGRAM and not c.raddr:
                found.add((process.pid, "udp", c.laddr.ip, c.laddr.port))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:  # ::ffff:127.0.0.1
        ip = ip.ipv4_mapped
    return ip.is_loopback  # 127.0.0.0/8 or ::1; 0.0.0.0 and :: (every interface) are not


def test_the_socket_check_sees_a_listener_on_every_interface():
    """The check below can fail: a socket listening on 0.0.0.0 is found and is not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        port = listener.getsockname()[1]
        found = listening_sockets([psutil.Process()])
    assert (psutil.Process().pid, "tcp", "0.0.0.0", port) in found
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")
    assert is_loopback("127.0.0.1") and is_loopback("127.3.4.5") and is_loopback("::1")
    assert is_loopback("::ffff:127.0.0.1")


@pytest.mark.slow
def test_nothing_listens_outside_loopback_during_a_ddp_run(tmp_path):
    """Sockets of the launcher and every process below it, sampled from start-up (rendezvous, bootstrap
    store) until the workers train (gloo); then SIGTERM to the launcher."""
    run_dir = tmp_path / "run"
    seen: set[tuple[int, str, str, int]] = set()
    with LiveRun(*LONG_DDP_RUN, f"hydra.run.dir={run_dir}") as run:
        def sample() -> bool:
            try:
                launcher = [psutil.Process(run.proc.pid)]
            except psutil.NoSuchProcess:
                launcher = []
            seen.update(listening_sockets([*launcher, *run.descendants()]))
            return "[ddp O0] iter" in run.stdout

        assert run.wait_until(sample, START_TIMEOUT_S, poll=0.02), run.describe()
        workers = run.workers()
        assert len(workers) == 2
        for _ in range(10):  # a little longer into training
            run.wait_until(sample, 0.05)
        sent = run.signal(signal.SIGTERM)
        code = run.wait(timeout=STOP_BOUND_S + 60)

    outside = sorted(s for s in seen if not is_loopback(s[2]))
    assert not outside, f"listening outside loopback: {outside}"
    owners = {pid for pid, *_ in seen}
    assert run.proc.pid in owners, seen  # the rendezvous/bootstrap store: the check did see listeners
    assert owners & {w.pid for w in workers}, seen  # gloo's listeners in the workers
    check_stopped_by_signal(run, code, sent, signal.SIGTERM, run_dir)


@pytest.mark.parametrize("method", ["elastic", "spawn"])
def test_workers_bootstrap_gloo_and_nccl_over_loopback(monkeypatch, method):
    """Workers inherit the environment the launcher sets around their start: NCCL, like gloo, on `lo`
    (NCCL would not pick the loopback interface while another exists)."""
    import os

    import harness.launch.launcher as launcher
    from harness.core.devices import Placement

    seen: dict[str, str] = {}
    monkeypatch.setattr(launcher, f"_{method}", lambda *args: seen.update(os.environ) or [])
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    placement = Placement(accelerator="cuda", gpus=(0, 1), torch_indices=(0, 1), nprocs=2,
                          one_process_per_device=True, devices=("cuda:0", "cuda:1"), threads_per_process=1,
                          global_batch=2, worker_env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert launcher.launch_workers(print, {}, placement, 5, "/nonexistent", method) == []
    loopback = launcher.loopback_interface()
    assert any(a.address.startswith("127.") for a in psutil.net_if_addrs()[loopback])
    assert seen["NCCL_SOCKET_IFNAME"] == seen["GLOO_SOCKET_IFNAME"] == loopback
    assert seen["MASTER_ADDR"] == "127.0.0.1" and seen["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "NCCL_SOCKET_IFNAME" not in os.environ  # set for the launch only


def _fail_on_rank_1(spec: dict) -> None:
    import os

    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 gives up")


@pytest.mark.slow
def test_spawn_launcher_reports_a_failing_worker(monkeypatch):
    """launcher=spawn: a worker that raises is a failure with its rank and message (fork keeps it quick)."""
    import harness.launch.launcher as launcher

    failures = launcher._spawn(_fail_on_rank_1, {}, 2, port=1, start_method="fork")
    assert [(f.rank, f.exitcode) for f in failures] == [(1, 1)]
    assert failures[0].message == "RuntimeError: rank 1 gives up" and failures[0].pid > 0


@pytest.mark.parametrize(("view", "expected"), [
    ({"eth0": ["10.0.0.5"], "lo": ["127.0.0.1"]}, "lo"),  # a host whose name resolves to 10.0.0.5
    ({"en0": ["192.168.1.7"], "lo0": ["127.0.0.1"]}, "lo0"),
    ({"eth0": ["10.0.0.5"], "docker0": ["172.17.0.1"], "loop": ["127.0.0.1"]}, "loop"),
])
def test_the_loopback_interface_is_the_one_holding_127_0_0_1(monkeypatch, view, expected):
    """gloo and NCCL are pinned to the interface that holds 127.0.0.1, whatever the hostname resolves to."""
    from types import SimpleNamespace

    import harness.launch.launcher as launcher

    fake = {name: [SimpleNamespace(family=socket.AF_PACKET, address="02:42:ac:11:00:02"),
                   *(SimpleNamespace(family=socket.AF_INET, address=a) for a in addresses)]
            for name, addresses in view.items()}
    monkeypatch.setattr(launcher.psutil, "net_if_addrs", lambda: fake)
    monkeypatch.setattr(launcher.socket, "gethostname", lambda: "node-resolving-to-10.0.0.5")
    assert launcher.loopback_interface() == expected
    assert launcher.loopback_env()["GLOO_SOCKET_IFNAME"] == expected == launcher.loopback_env()["NCCL_SOCKET_IFNAME"]


def _rank_1_fails_rank_0_waits(spec: dict) -> None:
    import os
    import time

    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 gives up")
    time.sleep(600)


@pytest.mark.slow
def test_spawn_launcher_stops_the_survivors_at_once_not_after_the_grace_period():
    """torch's ProcessContext.join(grace_period=10) waited 10 s before even sending SIGTERM to the others."""
    import time

    import harness.launch.launcher as launcher

    started = time.monotonic()
    failures = launcher._spawn(_rank_1_fails_rank_0_waits, {}, 2, port=1, start_method="fork")
    took = time.monotonic() - started
    assert [f.rank for f in failures] == [1]
    assert took < launcher.SHUTDOWN_GRACE_S / 2, f"{took:.1f} s: the survivor was not stopped at once"


_SEEN_BY_THIS_PROCESS: list[int] = []  # a worker forked from a server that ran a run before would find pids here


def _note_process(spec: dict) -> None:
    """What a worker finds at its start: written to `spec["out"]/<pid>.json`."""
    import json
    import os
    import sys
    from pathlib import Path

    found = {"pid": os.getpid(), "parent": os.getppid(), "carried": list(_SEEN_BY_THIS_PROCESS),
             "probe": os.environ.get("HARNESS_PROBE"), "torch_preloaded": "torch" in sys.modules}
    _SEEN_BY_THIS_PROCESS.append(os.getpid())
    Path(spec["out"], f"{os.getpid()}.json").write_text(json.dumps(found))


@pytest.mark.slow
def test_forked_workers_are_fresh_processes_with_the_runs_own_environment(tmp_path):
    """Two runs through the elastic launcher's fork server: four processes of their own, none carrying the
    state a worker of the first run left (the server only imports), each with its own run's environment
    (the server's was fixed when it started, during the first run), torch already imported."""
    import json

    import harness.launch.launcher as launcher
    from harness.core.devices import Placement

    for probe in ("first", "second"):
        out = tmp_path / probe
        out.mkdir()
        placement = Placement(accelerator="cpu", gpus=(), torch_indices=(), nprocs=2, one_process_per_device=True,
                              devices=("cpu:0", "cpu:1"), threads_per_process=1, global_batch=2,
                              worker_env={"HARNESS_PROBE": probe})
        assert launcher.launch_workers(_note_process, {"out": str(out)}, placement, 30, str(tmp_path / "logs"),
                                       "elastic", "forkserver") == []
    found = {probe: [json.loads(p.read_text()) for p in (tmp_path / probe).glob("*.json")] for probe in ("first",
                                                                                                        "second")}
    pids = [w["pid"] for workers in found.values() for w in workers]
    assert len(pids) == 4 and len(set(pids)) == 4
    assert all(w["carried"] == [] and w["torch_preloaded"] for workers in found.values() for w in workers)
    assert all(w["probe"] == probe for probe, workers in found.items() for w in workers)
    servers = {w["parent"] for workers in found.values() for w in workers}
    assert len(servers) == 1 and psutil.Process(servers.pop()).parent().pid == __import__("os").getpid()
