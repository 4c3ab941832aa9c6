"""Hydra callbacks of a sweep: before it starts, what its launcher would silently get wrong on this machine;
when it ends, the side-by-side report in the sweep folder."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class LauncherCheck(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        warning = local_jobs_without_gpus(config.hydra.launcher, gpu_count)
        if warning:
            log.warning("%s", warning)


def gpu_count() -> int:
    from harness.launch.placement import probe_hardware

    return len(probe_hardware().visible_gpus)


def local_jobs_without_gpus(launcher: DictConfig, gpus: Callable[[], int]) -> str | None:
    """submitit's local executor gives each job `CUDA_VISIBLE_DEVICES` = the first `gpus_per_node` GPUs,
    i.e. "" when it is unset: on a GPU machine every job would run on CPU. (GPUs counted only for it.)"""
    if not str(launcher.get("_target_", "")).endswith(".LocalLauncher") or launcher.get("gpus_per_node"):
        return None
    count = gpus()
    if count == 0:
        return None
    return (f"hydra/launcher=submitit_local gives its jobs no GPU unless hydra.launcher.gpus_per_node is set "
            f"(now {launcher.get('gpus_per_node')}): this machine has {count}; add "
            f"hydra.launcher.gpus_per_node={count} or the jobs run on CPU")


class ReportCallback(Callback):
    def __init__(self, baseline: str | None = None) -> None:
        self.baseline = baseline

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if sweep_dir.is_dir():
            report_sweep(sweep_dir, self.baseline)


def report_sweep(sweep_dir: Path, baseline: str | None) -> None:
    """The report of every run under `sweep_dir`, its table also kept in the sweep's own `sweep.log`
    (each job's lines are in the job's run.log; the last job's would otherwise get the report's)."""
    from harness.core.logs import add_file
    from harness.report.outputs import build_report

    root = logging.getLogger()
    job_files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    for handler in job_files:
        root.removeHandler(handler)
    sweep_log = add_file(sweep_dir / "sweep.log")
    try:
        log.info("writing the report of the runs in %s", sweep_dir)
        build_report([sweep_dir], sweep_dir, baseline)
    finally:
        root.removeHandler(sweep_log)
        sweep_log.close()
        for handler in job_files:
            root.addHandler(handler)
