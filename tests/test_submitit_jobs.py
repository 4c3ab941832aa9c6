"""Sweeps through hydra-submitit-launcher: one job per combination, one job at a time except on SLURM,
and the report built by the callback in the submitting process when the last job ends.

`hydra/launcher=submitit_local` runs for real here; SLURM is checked as far as it goes without a cluster:
the configs compose, and the plugin turns conf/hydra/launcher/slurm.yaml into the sbatch script it would
submit."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import RUN_PY
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig

from harness import cli
from tests.conftest import CONF_DIR, ONE_ROUND, QUICK_START, TINY, report_statuses

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the `slurm` extra is not installed")

SWEEP_TIMEOUT_S = 300


def hydra_config(*overrides: str) -> DictConfig:
    cli.register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def report_rows(report_md: str) -> dict[str, str]:
    """The report's rows as {combination: "ok", or "<status>: <reason>"}."""
    return report_statuses(report_md)


# ---------------------------------------------------------------------------------------------------
# Configs: which launcher, how many combinations at once
# ---------------------------------------------------------------------------------------------------

def test_the_plugins_slurm_launcher_composes_as_the_issue_writes_it():
    cfg = hydra_config("hydra/launcher=submitit_slurm", "hydra.launcher.gpus_per_node=4")
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.gpus_per_node == 4 and launcher.tasks_per_node == 1 and launcher.nodes == 1
    # Every job has GPUs of its own: as many at once as the launcher allows.
    assert cfg.hydra.sweeper.max_batch_size == launcher.array_parallelism == 256


def test_the_editable_slurm_yaml_extends_the_plugins_config():
    cfg = hydra_config("hydra/launcher=slurm", "hydra.launcher.gpus_per_node=4", "hydra.launcher.partition=gpu")
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.partition, launcher.gpus_per_node, launcher.tasks_per_node, launcher.nodes) == ("gpu", 4, 1, 1)
    assert launcher.timeout_min == 60 and launcher.cpus_per_task and launcher.mem_gb
    assert hydra_config("hydra/launcher=slurm").hydra.launcher.gpus_per_node == 4  # the yaml's value
    one_by_one = hydra_config("hydra/launcher=slurm", "hydra.launcher.array_parallelism=1")
    assert one_by_one.hydra.sweeper.max_batch_size == 1


@pytest.mark.parametrize("launcher", [None, "submitit_local"])
def test_other_launchers_run_one_combination_at_a_time(launcher):
    """submitit's local executor starts every job it is given at once: the sweeper gives it one."""
    cfg = hydra_config(*([f"hydra/launcher={launcher}"] if launcher else []))
    assert cfg.hydra.sweeper.max_batch_size == 1


def test_the_slurm_yaml_becomes_this_sbatch_script(tmp_path, monkeypatch):
    """The plugin's own launch(), up to the submission: parameters renamed, validated and rendered by submitit."""
    import submitit

    cfg = hydra_config("hydra/launcher=slurm", "hydra.launcher.gpus_per_node=4", "hydra.launcher.partition=gpu",
                       "+hydra.launcher.additional_parameters.exclusive=true",
                       "hydra.launcher.setup=[module load cuda]", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    submitted: dict[str, Any] = {}

    def fake_map_array(executor: Any, fn: Any, *args: Any) -> list[Any]:
        submitted["jobs"] = len(args[0])
        submitted["sbatch"] = executor._executor._make_submission_file_text("COMMAND", "uid")
        return []

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # "srun is there"
    monkeypatch.setattr(submitit.AutoExecutor, "map_array", fake_map_array)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    assert launcher.launch([["strategy=dp", "amp=O0"], ["strategy=ddp", "amp=O0"]], initial_job_idx=0) == []
    assert submitted["jobs"] == 2  # one job per combination
    sbatch = submitted["sbatch"].splitlines()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --nodes=1", "#SBATCH --cpus-per-task=8", "#SBATCH --mem=64GB", "#SBATCH --time=60",
                 "#SBATCH --exclusive", "module load cuda"):
        assert line in sbatch, submitted["sbatch"]
    assert any(line.startswith("srun ") and line.endswith(" COMMAND") for line in sbatch)


# ---------------------------------------------------------------------------------------------------
# A real sweep through submitit_local
# ---------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_sweep_through_submitit_local_ends_with_the_report(tmp_path):
    sweep = tmp_path / "sweep"
    proc = RUN_PY.run(["run.py", "-m", "hydra/launcher=submitit_local", "strategy=single,ddp", "amp=O0", *TINY,
                       ONE_ROUND, "iterations=40", QUICK_START, f"hydra.sweep.dir={sweep}"], SWEEP_TIMEOUT_S)
    out = f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, out

    results = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/results.json")}
    assert sorted(results) == ["0_single_O0", "1_ddp_O0"], out
    single, ddp = results["0_single_O0"], results["1_ddp_O0"]
    assert single["status"] == "ok" and ddp["status"] == "ok", (single["error"], ddp["error"])
    assert ddp["world_size"] == 2 and single["world_size"] == 1

    # Each combination was a submitit job of its own: a process other than the sweep's, with its log.
    jobs = [d for d in (sweep / ".submitit").iterdir() if list(d.glob("*_result.pkl"))]
    assert len(jobs) == 2, sorted(p.name for p in (sweep / ".submitit").iterdir())
    job_logs = "".join(p.read_text() for d in jobs for p in d.glob("*_log.out"))
    assert "results: " in job_logs and "Job completed successfully" in job_logs
    assert len({single["launcher_pid"], ddp["launcher_pid"]}) == 2
    # ... where a one-process strategy still trained in a fresh child process, as in any sweep.
    assert single["ranks"][0]["pid"] != single["launcher_pid"]

    # One at a time: the second job started after the first had finished.
    first, second = sorted((single, ddp), key=lambda r: r["started_at"])
    assert second["started_at"] >= first["finished_at"]

    # The callback built the report in the submitting process, after both jobs.
    assert f"report: {sweep / 'index.html'}" in proc.stdout and "report: " not in job_logs
    assert "no GPU" not in proc.stderr  # a CPU machine: nothing to warn about
    report_md = sweep / "report.md"
    assert report_md.stat().st_mtime >= max(r["finished_at"] for r in results.values()) - 1
    rows = report_rows(report_md.read_text())
    assert set(rows) == {"single O0", "ddp O0"}, report_md.read_text()
    assert all(said == "ok" for said in rows.values()), report_md.read_text()
    for name in ("report.csv", "report.json", "index.html"):
        assert (sweep / name).exists()


# ---------------------------------------------------------------------------------------------------
# Without a cluster: the parts of hydra/launcher=slurm that read SLURM's answers, and submitit_local's GPUs
# (tests/test_slurm.py runs them against a real slurmctld)
# ---------------------------------------------------------------------------------------------------

def test_without_accounting_job_states_come_from_squeue_and_an_unlisted_job_has_ended(monkeypatch):
    from harness.launch import submitit_jobs

    asked: list[list[str]] = []

    def sacct(command):  # sacct's own answer on a cluster without slurmdbd (stderr, exit code 1)
        asked.append(list(command))
        return "Slurm accounting storage is disabled"

    monkeypatch.setattr(submitit_jobs, "sacct_answer", sacct)
    watcher = submitit_jobs.AccountingFreeWatcher()
    for job in ("12_0", "12_1", "12_2", "13"):
        watcher.register_job(job)
    command = watcher._make_command()
    assert command[0] == "squeue" and watcher.squeue is True
    assert watcher._make_command() == command and len(asked) == 1  # sacct asked once, not at every poll
    # squeue's lines for an array with one task running and two pending behind a %1 limit; job 13 is gone.
    info = watcher.read_info(b"12_[1-2%1]|PENDING|\n12_0|RUNNING|vm\n")
    assert {job: info[job]["State"] for job in ("12_0", "12_1", "12_2", "13")} == {
        "12_0": "RUNNING", "12_1": "PENDING", "12_2": "PENDING", "13": submitit_jobs.UNLISTED}
    watcher._info_dict.update(info)
    assert [watcher.is_done(job, mode="cache") for job in ("12_0", "12_1", "13")] == [False, False, True]


@pytest.mark.parametrize("answer, uses", [(None, "sacct"), ("sacct: error: slurmdbd: connection refused", "sacct")])
def test_a_cluster_whose_sacct_answers_or_fails_otherwise_keeps_sacct(monkeypatch, answer, uses):
    """A real sacct error (slurmdbd down) stays submitit's to report: only "accounting is disabled" switches."""
    from harness.launch import submitit_jobs

    monkeypatch.setattr(submitit_jobs, "sacct_answer", lambda command: answer)
    watcher = submitit_jobs.AccountingFreeWatcher()
    watcher.register_job("7")
    assert watcher._make_command()[0] == uses
    assert watcher.read_info("JobID|State|NodeList\n7|COMPLETED|vm\n")["7"]["State"] == "COMPLETED"


@pytest.fixture
def two_fake_gpus(monkeypatch):
    """torch.cuda as on a machine with two GPUs: probe_hardware reads `torch.cuda.is_available()` and
    `torch.cuda.device_count()` (harness/launch/placement.py), nothing else."""
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def launcher_warnings(caplog, *overrides):
    from harness.report.callbacks import LauncherCheck

    cfg = hydra_config(*overrides)
    assert cfg.hydra.callbacks.launcher_check._target_.endswith("LauncherCheck")  # Hydra calls it
    caplog.clear()
    with caplog.at_level("WARNING", logger="harness.report.callbacks"):
        LauncherCheck().on_multirun_start(config=cfg)
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_submitit_local_on_a_gpu_machine_without_gpus_per_node_is_warned_once_naming_the_key(two_fake_gpus, caplog):
    # submitit's local executor: `gpus = range(n_gpus) ...` then `CUDA_VISIBLE_DEVICES=cuda_devices`: "" for 0
    warnings = launcher_warnings(caplog, "hydra/launcher=submitit_local")
    assert len(warnings) == 1, warnings
    assert "hydra.launcher.gpus_per_node=2" in warnings[0] and "no GPU" in warnings[0]
    assert launcher_warnings(caplog, "hydra/launcher=submitit_local", "hydra.launcher.gpus_per_node=2") == []
    assert launcher_warnings(caplog, "hydra/launcher=slurm") == []  # SLURM jobs ask for gpus_per_node: 4


def test_submitit_local_on_a_cpu_machine_is_not_warned(monkeypatch, caplog):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert launcher_warnings(caplog, "hydra/launcher=submitit_local") == []


def test_a_stop_signal_before_the_run_starts_is_held_and_stops_the_run_at_once(monkeypatch):
    """A SLURM job's process holds SIGTERM/SIGUSR2 from its start (the launcher's __call__): SLURM's warning
    during start-up neither kills it (SIGUSR2's default action) nor is lost; the run stops as it starts."""
    import os
    import signal

    from harness.core.stops import Interrupted, StopRequest
    from harness.launch import runner

    held = StopRequest()
    monkeypatch.setattr(runner, "_held", held)
    before = {s: signal.getsignal(s) for s in runner.STOP_SIGNALS}
    try:
        runner.hold_stop_signals()
        os.kill(os.getpid(), signal.SIGUSR2)  # noted, nothing raised
        with pytest.raises(Interrupted, match="stopped by SIGUSR2, SLURM's warning that the job's time limit"):
            with runner._signals_as_interrupt():
                raise AssertionError("the run started although SLURM had asked it to stop")
    finally:
        held.restore()
    assert {s: signal.getsignal(s) for s in runner.STOP_SIGNALS} == before
