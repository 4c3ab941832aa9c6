"""`run.py` started by torchrun: this process is one worker of a run torchrun launched, on one node
or several. It launches nothing; global rank 0 alone writes the run's folder and results.json.

Each node's local rank 0 samples its own node's memory (NVML or psutil, over the torchrun agent's
workers); at the end every rank's record and every node's samples are gathered to global rank 0.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch.distributed as dist
from omegaconf import OmegaConf

from harness.compose import Composed, compose_one, hydra_context
from harness.core.config import CONF_DIR, RunConfig
from harness.core.errors import ConfigError
from harness.core.logs import setup_worker
from harness.core.rank_record import RankRecord
from harness.core.results import (
    PARAMETERS_NAME,
    Environment,
    Memory,
    RunRecord,
    environment,
    record_of,
    write_provisional,
)
from harness.launch.decide import run_plan
from harness.launch.placement import TorchrunWorld, probe_hardware
from harness.launch.runner import (
    measured,
    memory_section,
    planned,
    publish,
    read_records,
    run_status,
)
from harness.memory.sampler import MemorySampler, Sample, SamplerFindings, open_source
from harness.rank.run_plan import RankSpec, RunPlan
from harness.rank.worker import rank_identity, run_rank

log = logging.getLogger(__name__)
PROVISIONAL_REASON = ("global rank 0 ended without recording the run: killed before it could write (NCCL's "
                      "watchdog aborting it after a peer died, the kernel's OOM killer, SIGKILL); torchrun's "
                      "output names the first rank that failed")


def torchrun_strategies() -> list[str]:
    """The conf/strategy/ choices whose class runs one process per device: the ones torchrun can start."""
    from hydra.utils import get_class

    from harness.core.options import option_target

    names = []
    for path in sorted((CONF_DIR / "strategy").glob("*.yaml")):
        target = option_target(OmegaConf.load(path))
        try:
            if target and get_class(target).one_process_per_device:
                names.append(path.stem)
        except Exception:  # noqa: BLE001 (a strategy whose optional package is missing still counts by name)
            continue
    return names


def compose_config(overrides: list[str]) -> Composed:
    """Every torchrun worker composes the same config from the same command line (no output folders)."""
    with hydra_context():
        return compose_one(overrides)


def run_dir_for(cfg: RunConfig, now: dt.datetime) -> Path:
    return Path("runs") / now.strftime("%Y-%m-%d") / f"{now:%H-%M-%S-%f}_{cfg.strategy_name}_{cfg.amp.level}_torchrun"


def split_run_dir(overrides: list[str]) -> tuple[list[str], Path | None]:
    """`hydra.run.dir=DIR` names the run's folder, as for plain `python run.py` (compose() ignores it)."""
    from hydra.core.utils import setup_globals

    rest, run_dir = [], None
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and key.lstrip("+") == "hydra.run.dir":
            setup_globals()  # the `now` resolver, as in hydra.run.dir='runs/${now:%H-%M-%S}'
            run_dir = Path(str(OmegaConf.create({"dir": value}).dir))
        else:
            rest.append(override)
    return rest, run_dir


def node_labelled(findings: SamplerFindings, devices: tuple[str, ...]) -> SamplerFindings:
    """NVML names this node's GPUs cuda:N; a multi-node run names them node<K>/cuda:N. (psutil's "cpu" stays.)"""
    label = {d.rpartition("/")[2]: d for d in devices if "/" in d}
    tracker = findings.tracker

    def by_device(values: dict[str, float]) -> dict[str, float]:
        return {label.get(k, k): v for k, v in values.items()}

    def by_process(values: dict[tuple[int, str], float]) -> dict[tuple[int, str], float]:
        return {(pid, label.get(d, d)): v for (pid, d), v in values.items()}

    tracker.peak_device, tracker.peak_process = by_device(tracker.peak_device), by_process(tracker.peak_process)
    if tracker.baseline is not None:
        tracker.baseline = Sample(by_device(tracker.baseline.per_device), by_process(tracker.baseline.per_process))
    return findings


@dataclass(frozen=True)
class NodeFindings:
    """What a node's local rank 0 sends global rank 0: its devices and what its memory sampler saw."""

    node_rank: int
    devices: tuple[str, ...]
    launcher_pid: int  # the node's torchrun agent
    sampler: SamplerFindings | None


@dataclass(frozen=True)
class Gathered:
    """One rank's part of the run, gathered to global rank 0 (a node's local rank 0 adds its node's)."""

    record: RankRecord
    node: NodeFindings | None = None


def torchrun_record(decided: RunPlan, overrides: list[str]) -> RunRecord:
    """The plan's record (harness.launch.runner.planned), run by torchrun."""
    return replace(planned(decided, overrides),
                   env=replace(record_of(Environment, environment()), launcher="torchrun"))


def run_worker(overrides: list[str]) -> int:
    started = time.time()
    rank, local_rank, _ = rank_identity()
    overrides, out_dir = split_run_dir(overrides)
    composed = compose_config(overrides)
    cfg = composed.run
    decided = run_plan(cfg, probe_hardware(), resolved=composed.config, torchrun=TorchrunWorld.from_env(os.environ))
    placement = decided.placement
    if not decided.strategy_cls.one_process_per_device:
        raise ConfigError("strategy", cfg.strategy_name, "one process per device under torchrun (" +
                          ", ".join(torchrun_strategies()) + "); run other strategies as plain `python run.py`")
    if not decided.will_run:  # alone, as for a plain run: nothing to measure, or a package missing, is an error
        raise ConfigError("strategy", cfg.strategy_name, decided.skip or decided.unavailable)

    out_dir = out_dir or run_dir_for(cfg, dt.datetime.now())
    setup_worker(out_dir / "run.log", rank)
    if rank == 0:
        write_provisional(out_dir, torchrun_record(decided, overrides), PROVISIONAL_REASON)
    sampler = None
    launcher_pid = os.getppid()  # the torchrun agent of this node
    if local_rank == 0 and cfg.memory.enabled:
        source, warning = open_source(placement.accelerator, placement.gpus, launcher_pid, placement.gpu_tokens)
        if warning:
            log.warning("%s", warning)
        sampler = MemorySampler(source, cfg.memory.interval_ms / 1000).start() if source else None

    record_dir = Path(tempfile.mkdtemp(prefix=f"harness-rank{rank}-"))
    spec = RankSpec(plan=decided, record_dir=str(record_dir), parameters_path=str(out_dir / PARAMETERS_NAME))

    def gather(record: RankRecord) -> None:
        if sampler is not None:
            sampler.stop()
        node = NodeFindings(placement.node_rank, placement.devices, launcher_pid,
                            node_labelled(sampler.findings(), placement.devices) if sampler else None)
        payload = Gathered(record, node if local_rank == 0 else None)
        gathered: list[Gathered | None] | None = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(payload, gathered, dst=0)
        if gathered is not None:  # rank 0
            write_results(decided, [g for g in gathered if g is not None], started, overrides, out_dir)

    try:
        run_rank(spec, before_teardown=gather)
    except BaseException:
        if rank == 0:  # the process group is gone: record what this rank knows
            records = read_records(record_dir)
            write_results(decided, [Gathered(r) for r in records], started, overrides, out_dir)
        raise
    finally:
        shutil.rmtree(record_dir, ignore_errors=True)  # this rank's record: sent to rank 0 or written by it
    return 0


def write_results(decided: RunPlan, gathered: list[Gathered], started: float, overrides: list[str],
                  out_dir: Path) -> None:
    placement = decided.placement
    records: list[RankRecord] = sorted((g.record for g in gathered), key=lambda r: r.rank)
    nodes = sorted((g.node for g in gathered if g.node), key=lambda n: n.node_rank)
    devices = [d for n in nodes for d in n.devices] or list(placement.devices)
    stopped = next((r.error for r in records if r.status == "interrupted"), None)  # SIGTERM: scancel
    status, error = run_status(records, [], stopped)
    if status == "ok" and len(records) < placement.world_size:
        status, error = "failed", f"only {len(records)} of {placement.world_size} ranks reported"
    sections = []
    for node in nodes:
        node_records = [r for r in records if r.device in node.devices]
        section = memory_section(node.sampler, node.devices, node_records, node.launcher_pid, None)
        sections.append(replace(section, per_process=[replace(p, node=node.node_rank) for p in section.per_process]))
    memory = Memory(source="+".join(sorted({s.source for s in sections if s.source})) or None,
                    per_device=[d for s in sections for d in s.per_device],
                    per_process=[p for s in sections for p in s.per_process])
    record = replace(measured(torchrun_record(decided, overrides), decided, records, started, out_dir),
                     status=status, error=error, devices=devices, memory=memory, finished_at=time.time())
    publish(out_dir, record)
