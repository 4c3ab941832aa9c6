"""`run.py` started by torchrun, on one node or as two "nodes" of one CPU machine: one results.json from
global rank 0 with every node's devices and processes; a node that never joins ends in a rendezvous
timeout, not a hang. Plus the pieces without processes: the run folder override, GPU labels per node,
and the report's arithmetic over nodes x devices."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.core.amp_levels import resolve
from harness.core.inputs import images
from harness.core.rank_record import RankRecord
from harness.core.results import DeviceMemory
from harness.launch import torchrun
from harness.launch.placement import Hardware, TorchrunWorld, place
from harness.launch.runner import memory_section
from harness.memory.sampler import MemoryTracker, Sample, SamplerFindings
from harness.rank.run_plan import RunPlan
from harness.report import build_rows
from strategies.ddp import TorchDDP
from tests.conftest import REPO, TINY, config_dict, run_config

RUN = ("strategy=ddp", *TINY, "iterations=40")
AGENT_TIMEOUT_S = 240  # a two-"node" run is ~20 s on a loaded 2-core machine
JOIN_TIMEOUT_S = 5  # --rdzv-conf=join_timeout for the tests where a node never comes
FAIL_BOUND_S = 60  # ... and how soon the lonely agent must have given up


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(*torchrun_args: str, overrides: tuple[str, ...], run_dir: Path) -> list[str]:
    """`torchrun ARGS run.py OVERRIDES hydra.run.dir=RUN_DIR` (torchrun is torch.distributed.run)."""
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_args, "run.py", *overrides,
            f"hydra.run.dir={run_dir}"]


class Agent:
    """One torchrun agent (one "node") as a subprocess in the repository root, its output in a log file."""

    def __init__(self, cmd: list[str], log: Path, tmpdir: Path | None = None) -> None:
        self.log = log
        env = {**os.environ, "TMPDIR": str(tmpdir)} if tmpdir else None
        with open(log, "w") as handle:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)

    def finish(self, timeout: float) -> tuple[int, str]:
        try:
            code: int | None = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # the agent; its workers notice their parent is gone
            self.proc.wait()
            code = None
        text = self.log.read_text()
        assert code is not None, f"agent still running after {timeout} s:\n{text[-4000:]}"
        return code, text


def scratch(tmp_path: Path) -> Path:
    """The agents' TMPDIR: where each rank keeps its record until the end of the run."""
    path = tmp_path / "tmp"
    path.mkdir()
    return path


def results_files(root: Path) -> list[Path]:
    return sorted(root.rglob("results.json"))


def describe(*logs: str) -> str:
    return "\n".join(f"--- agent {i} ---\n{text[-3000:]}" for i, text in enumerate(logs))


# ---------------------------------------------------------------------------------------------------
# Real runs
# ---------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_torchrun_agents_as_two_nodes_write_one_results_file(tmp_path):
    port, run_dir = free_port(), tmp_path / "run"
    args = ("--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id=harness-test-{port}", f"--rdzv-conf=join_timeout={AGENT_TIMEOUT_S}")
    cmd = torchrun_cmd(*args, overrides=RUN, run_dir=run_dir)
    tmpdir = scratch(tmp_path)
    agents = [Agent(cmd, tmp_path / f"agent{n}.log", tmpdir) for n in range(2)]
    finished = [a.finish(AGENT_TIMEOUT_S) for a in agents]
    logs = [text for _, text in finished]
    assert [code for code, _ in finished] == [0, 0], describe(*logs)

    assert results_files(tmp_path) == [run_dir / "results.json"], describe(*logs)  # global rank 0 alone wrote
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "ok", results["error"]
    assert results["world_size"] == 2 and results["nodes"] == 2
    assert results["devices"] == ["node0/cpu:0", "node1/cpu:1"]
    assert results["env"]["launcher"] == "torchrun"
    assert sorted(r["rank"] for r in results["ranks"]) == [0, 1]
    assert results["local_batch"] == 4 and results["global_batch"] == 8
    assert [w["end_iter"] for w in results["windows"]] == [20, 40]
    assert results["throughput_img_s"] and results["throughput_img_s"] > 0

    memory = results["memory"]
    assert memory["source"] == "psutil"
    procs = memory["per_process"]
    assert len(procs) == 2, procs
    assert sorted(p["node"] for p in procs) == [0, 1]  # each node's local rank 0 sampled its own node
    assert sorted(p["rank"] for p in procs) == [0, 1]
    assert len({p["pid"] for p in procs}) == 2 and all(p["host"] and p["peak_mib"] > 0 for p in procs)
    by_rank = {p["rank"]: p for p in procs}
    assert by_rank[0]["device"] == "node0/cpu:0" and by_rank[1]["device"] == "node1/cpu:1"
    assert [d["device"] for d in memory["per_device"]] == ["node0/cpu:0", "node1/cpu:1"]
    assert all(d["peak_mib"] > 0 for d in memory["per_device"])
    # Only global rank 0 says where the results went; no rank leaves its record behind.
    assert sum("results: " in text for text in logs) == 1, describe(*logs)
    assert not list(tmpdir.glob("harness-rank*"))


@pytest.mark.slow
def test_torchrun_on_one_node_two_processes(tmp_path):
    run_dir = tmp_path / "run"
    cmd = torchrun_cmd("--standalone", "--nnodes=1", "--nproc-per-node=2", overrides=RUN, run_dir=run_dir)
    tmpdir = scratch(tmp_path)
    code, log = Agent(cmd, tmp_path / "agent.log", tmpdir).finish(AGENT_TIMEOUT_S)
    assert code == 0, log[-4000:]
    assert results_files(tmp_path) == [run_dir / "results.json"]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "ok", results["error"]
    assert results["world_size"] == 2 and results["nodes"] == 1
    assert results["devices"] == ["cpu:0", "cpu:1"]  # no node prefix on one node
    procs = results["memory"]["per_process"]
    assert sorted(p["rank"] for p in procs) == [0, 1] and {p["node"] for p in procs} == {0}
    assert not list(tmpdir.glob("harness-rank*"))


@pytest.mark.slow
def test_rank_0_killed_without_a_chance_to_write_still_leaves_a_failed_record(tmp_path):
    """What NCCL's watchdog does to rank 0 after a peer died (abort, no Python `finally`), imitated by
    `fault.kind=exit` on rank 0 (os._exit). Before: no results.json at all."""
    run_dir = tmp_path / "run"
    cmd = torchrun_cmd("--standalone", "--nnodes=1", "--nproc-per-node=2",
                       overrides=(*RUN, "fault.kind=exit", "fault.rank=0", "fault.at_iter=3"), run_dir=run_dir)
    code, log = Agent(cmd, tmp_path / "agent.log", scratch(tmp_path)).finish(AGENT_TIMEOUT_S)
    assert code != 0, log[-4000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "failed" and results["provisional"] is True
    assert "rank 0 ended without recording" in results["error"]
    assert results["strategy"] == "ddp" and results["world_size"] == 2 and results["env"]["launcher"] == "torchrun"


def test_a_provisional_record_is_replaced_by_the_real_one_and_nothing_else_is(tmp_path):
    from harness.core.results import RunRecord, write_provisional, write_results

    run = {"strategy": "ddp", "amp": "O0", "model": "tiny_cnn"}
    write_provisional(tmp_path, RunRecord(schema=2, status="ok", **run), "killed before writing")
    assert json.loads((tmp_path / "results.json").read_text())["provisional"] is True
    write_results(tmp_path, {**run, "status": "ok"})
    written = json.loads((tmp_path / "results.json").read_text())
    assert (written["status"], written["error"], written["provisional"]) == ("ok", None, False)
    with pytest.raises(FileExistsError):
        write_results(tmp_path, {**run, "status": "ok"})


@pytest.mark.slow
def test_a_node_that_never_joins_ends_in_a_rendezvous_timeout(tmp_path):
    """The second agent is never started: the first gives up after join_timeout, no results, no hang."""
    port, run_dir = free_port(), tmp_path / "run"
    cmd = torchrun_cmd("--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                       f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=harness-lonely-{port}",
                       f"--rdzv-conf=join_timeout={JOIN_TIMEOUT_S}", overrides=RUN, run_dir=run_dir)
    began = time.monotonic()
    code, log = Agent(cmd, tmp_path / "agent.log").finish(FAIL_BOUND_S + 60)
    took = time.monotonic() - began
    assert code != 0, log[-4000:]
    assert took < FAIL_BOUND_S, f"gave up only after {took:.0f} s"
    assert took >= JOIN_TIMEOUT_S - 1  # it did wait for the other node first
    assert "RendezvousTimeoutError" in log, log[-4000:]
    assert results_files(tmp_path) == [] and not run_dir.exists()


@pytest.mark.slow
def test_a_node_whose_rendezvous_host_never_starts_gives_up_after_read_timeout(tmp_path):
    """The other side: the node hosting the rendezvous store (--rdzv-endpoint) is the missing one."""
    port, run_dir = free_port(), tmp_path / "run"
    cmd = torchrun_cmd("--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                       f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=harness-hostless-{port}",
                       f"--rdzv-conf=join_timeout={JOIN_TIMEOUT_S},read_timeout={JOIN_TIMEOUT_S},is_host=false",
                       overrides=RUN, run_dir=run_dir)
    began = time.monotonic()
    code, log = Agent(cmd, tmp_path / "agent.log").finish(FAIL_BOUND_S + 60)
    took = time.monotonic() - began
    assert code != 0, log[-4000:]
    assert took < FAIL_BOUND_S, f"gave up only after {took:.0f} s"
    assert "RendezvousConnectionError" in log and "timed out" in log, log[-4000:]
    assert results_files(tmp_path) == [] and not run_dir.exists()


# ---------------------------------------------------------------------------------------------------
# Without processes
# ---------------------------------------------------------------------------------------------------

def test_hydra_run_dir_names_the_folder_and_is_not_passed_to_compose(tmp_path):
    rest, run_dir = torchrun.split_run_dir(["strategy=ddp", f"hydra.run.dir={tmp_path}/x", "iterations=40"])
    assert rest == ["strategy=ddp", "iterations=40"] and run_dir == tmp_path / "x"
    assert torchrun.split_run_dir(["strategy=ddp"]) == (["strategy=ddp"], None)
    _, stamped = torchrun.split_run_dir(["hydra.run.dir=runs/${now:%Y}/a"])
    assert stamped == Path("runs") / time.strftime("%Y") / "a"


def _nvml_findings(pids: tuple[int, int]) -> SamplerFindings:
    """What NVML on one node sees: its GPUs as cuda:0 and cuda:1, one worker PID on each."""
    tracker = MemoryTracker()
    tracker.add(Sample(per_device={"cuda:0": 500.0, "cuda:1": 500.0}))  # baseline before the run
    tracker.add(Sample(per_device={"cuda:0": 2500.0, "cuda:1": 2300.0},
                       per_process={(pids[0], "cuda:0"): 2000.0, (pids[1], "cuda:1"): 1800.0}))
    return SamplerFindings(tracker, "nvml", None)


def test_gpu_memory_of_a_second_node_is_labelled_with_its_node():
    devices = ("node1/cuda:0", "node1/cuda:1")
    records = [RankRecord(rank=2, pid=41, device=devices[0], host="b"),
               RankRecord(rank=3, pid=42, device=devices[1], host="b")]
    findings = torchrun.node_labelled(_nvml_findings((41, 42)), devices)
    memory = memory_section(findings, devices, records, launcher_pid=40, warning=None)
    assert memory.per_device == [DeviceMemory(device="node1/cuda:0", peak_mib=2500.0, baseline_mib=500.0),
                                 DeviceMemory(device="node1/cuda:1", peak_mib=2300.0, baseline_mib=500.0)]
    assert [(p.rank, p.device, p.host) for p in memory.per_process] == [
        (2, "node1/cuda:0", "b"), (3, "node1/cuda:1", "b")]
    # One node: labels are the plain cuda:N and nothing changes.
    plain = torchrun.node_labelled(_nvml_findings((41, 42)), ("cuda:0", "cuda:1"))
    assert set(plain.tracker.peak_device) == {"cuda:0", "cuda:1"}


def _window(end_iter: int, seconds: float, cumulative: float, warmup: bool) -> dict[str, Any]:
    return {"end_iter": end_iter, "seconds": seconds, "cumulative_seconds": cumulative, "warmup": warmup,
            "loss": 2.0}


def _two_nodes_two_gpus_results(out_dir: Path) -> dict[str, Any]:
    """torchrun.write_results for 2 nodes x 2 GPUs, fed what each rank and node would send to rank 0.
    The PIDs repeat across nodes, as in containers."""
    cfg_dict = config_dict("ddp", batch_size=16)
    cfg = run_config("ddp", batch_size=16)
    placement = place(cfg, Hardware(visible_gpus=(0, 1), cores=8), one_process_per_device=True,
                      drives_all_devices=False, needs_cuda=False,
                      torchrun=TorchrunWorld(local_world_size=2, nodes=2, node_rank=0))
    precision = resolve(cfg.amp, "cuda")
    gathered = []
    for rank in range(4):
        node, local = divmod(rank, 2)
        device = f"node{node}/cuda:{local}"
        record = RankRecord.from_json({
            "rank": rank, "local_rank": local, "pid": 41 + local, "host": f"host{node}", "device": device,
            "status": "ok", "error": None, "allocator": [], "amp_state": {}, "first_iter_time": 1.0,
            "ended_at": 2.0, "windows": [_window(20, 1.0, 1.0, True), _window(40, 0.5, 1.5, False)]})
        node_info = None
        if local == 0:
            devices = (f"node{node}/cuda:0", f"node{node}/cuda:1")
            node_info = torchrun.NodeFindings(node_rank=node, devices=devices, launcher_pid=40,
                                              sampler=torchrun.node_labelled(_nvml_findings((41, 42)), devices))
        gathered.append(torchrun.Gathered(record, node_info))
    decided = RunPlan(config=cfg, resolved=cfg_dict, strategy_cls=TorchDDP, placement=placement, amp=precision,
                      launched=True, inputs=images(cfg.data.image_size, cfg.data.num_classes))
    torchrun.write_results(decided, gathered, 0.0, ["strategy=ddp"], out_dir)
    return json.loads((out_dir / "results.json").read_text())


def test_two_nodes_of_two_gpus_make_one_run_of_four_devices(tmp_path):
    results = _two_nodes_two_gpus_results(tmp_path / "run")
    assert results["status"] == "ok" and results["world_size"] == 4 and results["nodes"] == 2
    assert results["local_batch"] == 4
    assert results["devices"] == ["node0/cuda:0", "node0/cuda:1", "node1/cuda:0", "node1/cuda:1"]
    assert [d["device"] for d in results["memory"]["per_device"]] == results["devices"]
    assert all(d["peak_mib"] > d["baseline_mib"] for d in results["memory"]["per_device"])
    assert sorted((p["node"], p["rank"], p["device"]) for p in results["memory"]["per_process"]) == [
        (0, 0, "node0/cuda:0"), (0, 1, "node0/cuda:1"), (1, 2, "node1/cuda:0"), (1, 3, "node1/cuda:1")]
    imbalance = (tmp_path / "run" / "imbalance.md").read_text()
    assert "stray" not in imbalance and "one PID per device" in imbalance


def test_report_efficiency_counts_every_device_of_every_node(tmp_path):
    ddp = _two_nodes_two_gpus_results(tmp_path / "run")
    single = {**ddp, "strategy": "single", "devices": ["cuda:0"], "world_size": 1, "nodes": 1,
              "throughput_img_s": ddp["throughput_img_s"] / 3,
              "memory": {"source": "nvml", "per_device": [], "per_process": []}}
    rows, baseline = build_rows([(Path("a"), single), (Path("b"), ddp)])
    assert baseline == "single O0"
    row = next(r for r in rows if r.strategy == "ddp")
    assert row.n_devices == 4 and row.processes == 4  # PIDs 41 and 42 on both nodes are four processes
    assert row.speedup == pytest.approx(3.0)
    assert row.efficiency == pytest.approx(3.0 / 4)
