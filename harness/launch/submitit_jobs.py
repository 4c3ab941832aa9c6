"""Sweeps whose combinations are SLURM jobs (`hydra/launcher=slurm`, hydra_plugins/harness_slurm_launcher.py:
hydra-submitit-launcher's SlurmLauncher), every job's end, on SLURM's terms, a row of the report.

- A job's process holds stop signals from its start (runner.hold_stop_signals): scancel's SIGTERM and the
  time-limit warning's SIGUSR2 (`--signal=USR2@signal_delay_s`) end the run on record, `interrupted` with
  its windows so far; the job then returns as usual and the sweep goes on.
- A job that ends without a result (killed outright: the kernel's OOM killer, a lost node, SIGKILL once
  KillWait is over) is a `failed` row written by the submitting process, not an exception that ends the
  sweep before its report while the other jobs run on.
- On clusters without accounting `sacct` says so at every poll, and submitit never learns that a job which
  left no result has ended, so it waits forever. There, job states come from `squeue`, said in one line.
"""

from __future__ import annotations

import copy
import logging
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf, open_dict, read_write
from submitit.core.utils import UncompletedJobError
from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

from harness.core.results import RunRecord
from harness.core.stops import last_line

log = logging.getLogger(__name__)

ACCOUNTING_OFF = "accounting storage is disabled"  # what sacct prints (stderr, exit 1) without slurmdbd
# A job squeue no longer lists: ended over MinJobAge ago, or an array task cancelled before it started
UNLISTED = "ended, no longer listed by squeue"


class AccountingFreeWatcher(SlurmInfoWatcher):
    """submitit's job-state watcher, asking squeue where sacct has nothing to say (no accounting).

    squeue lists finished jobs for MinJobAge seconds (300 by default); a job no longer listed has ended."""

    def __init__(self, delay_s: int = 600) -> None:
        super().__init__(delay_s)
        self.squeue: bool | None = None  # decided by the first poll that sacct answers one way or the other

    def _make_command(self) -> list[str] | None:
        command = super()._make_command()
        if command is None or self.squeue is False:
            return command
        if self.squeue is None:
            answer = sacct_answer(command)
            if answer is None:
                self.squeue = False
                return command
            if ACCOUNTING_OFF not in answer.lower() and "no such file" not in answer.lower():
                return command  # a real sacct error (slurmdbd down): submitit warns about it, as it should
            self.squeue = True
            log.info("this SLURM cluster keeps no accounting (sacct: %s): job states come from squeue", answer)
        return ["squeue", "--noheader", "--states=all", "--format=%i|%T|%N", f"--user={os.getuid()}"]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        if not self.squeue:
            return super().read_info(string)
        text = string.decode() if isinstance(string, bytes) else string
        info = super().read_info("JobID|State|NodeList\n" + text)  # sacct's --parsable2 layout
        for job_id in self._registered - self._finished - set(info):
            info[job_id] = {"JobID": job_id, "State": UNLISTED, "NodeList": ""}
        return info


def sacct_answer(command: Sequence[str]) -> str | None:
    """None when sacct answers; otherwise what it said instead."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=60)
    except FileNotFoundError as error:
        return str(error)
    except subprocess.TimeoutExpired:
        return "timed out"
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit code {done.returncode}")


def watch_without_accounting() -> None:
    """submitit keeps one watcher for every SlurmJob (a class attribute, `SlurmInfoWatcher(delay_s=600)`)."""
    if not isinstance(SlurmJob.watcher, AccountingFreeWatcher):
        SlurmJob.watcher = AccountingFreeWatcher(delay_s=600)


@contextmanager
def lost_jobs_as_rows(record: Callable[[SlurmJob, UncompletedJobError], JobReturn]) -> Iterator[None]:
    """The plugin's launch ends with `return [j.results()[0] for j in jobs]`: one job that left no result
    raises there, and the sweep ends without its report while the other jobs run on. While it runs, such a
    job's results are the row `record` writes. (submitit makes array jobs as `SlurmJob(...)` itself, so a
    job class of our own cannot be slipped in.)"""
    original = SlurmJob.results

    def results(job: SlurmJob) -> list[Any]:
        try:
            return original(job)
        except UncompletedJobError as error:  # also FailedJobError: the job raised
            return [record(job, error)]

    SlurmJob.results = results  # type: ignore[method-assign]
    try:
        yield
    finally:
        SlurmJob.results = original  # type: ignore[method-assign]


def record_lost(launcher: Any, job: SlurmJob, error: UncompletedJobError,
                record_not_run: Callable[..., RunRecord]) -> JobReturn:
    """The row of a job that left no result (`launcher`: the sweep's SlurmLauncher): status failed, and why,
    written by `record_not_run` (the command line's, handed down by the launcher plugin: the parent's side
    does not import the command line above it)."""

    overrides, _, job_num = job.submission().args[:3]
    assert launcher.hydra_context is not None and launcher.config is not None
    sweep_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    with open_dict(sweep_config.hydra.job):
        sweep_config.hydra.job.num = job_num
    run_dir = Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
    strategy = str(sweep_config.hydra.runtime.choices.strategy)
    why = f"the SLURM job {job.job_id} ended without a result (state: {job.state})"
    if "has not produced any output" not in str(error):
        why = f"the SLURM job {job.job_id} failed: {last_line(error)}"
    if job.paths.stdout.exists():
        why += f"; its log: {job.paths.stdout}"
    if (run_dir / "results.json").exists():  # it got as far as writing its results before it was killed
        log.warning("[%s] %s; keeping the results it wrote", run_dir.name, why)
        results = None
    else:
        task_cfg = copy.deepcopy(sweep_config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        cfg_dict = OmegaConf.to_container(task_cfg, resolve=True)
        log.error("[%s] %s", run_dir.name, why)
        results = record_not_run(cfg_dict, strategy, run_dir, list(overrides), "failed", why)
    return JobReturn(overrides=list(overrides), working_dir=str(run_dir), task_name=str(job.job_id),
                     status=JobStatus.COMPLETED, _return_value=results)
