"""Sweeps and a multi-node recipe against a real SLURM: a private one-node cluster (tests/slurm_cluster.py)
started for this module, without accounting, as small clusters often are.

Everything is started at once and the tests read what it left, so the waits overlap: a two-strategy sweep
that must end `ok`; a long job cancelled with scancel mid-run (and a second one cancelled before it
started); a long job given one minute that must stop on SLURM's time-limit warning; scripts/
slurm_torchrun.sbatch on one node with two torchrun agents. `pytest -m slurm` runs only these.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import ONE_ROUND, REPO, RUN_PY, TINY, Forked, report_statuses
from slurm_cluster import SlurmCluster, free_port, missing_binaries

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the `slurm` extra is not installed")
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.xdist_group("slurm"),  # one cluster serves the module: one xdist worker runs it all
    pytest.mark.skipif(bool(missing_binaries()), reason="SLURM is not installed (needs slurm-wlm and munge): "
                       f"missing {', '.join(missing_binaries())}"),
]

START_S = 240  # a job's process start on a loaded 2-core machine: 5-60 s
# SLURM checks time limits every 30 s: the warning comes at the first check within SIGNAL_DELAY_S + 30 s of
# the limit, the kill at the first check after it. A two-minute job warned 60 s ahead gets SIGUSR2 30-60 s
# in (after its first windows) and at least 60 s to stop before the kill (30 s was too little once, on a
# loaded CI machine).
TIMEOUT_MIN, SIGNAL_DELAY_S = 2, 60
LAUNCHER = ("hydra/launcher=slurm", "hydra.launcher.gpus_per_node=null", "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=null", "sweep=none", *TINY, "log_every=10")
# Jobs that run until cancelled or timed out: mostly asleep in a slow dataset (20 ms an image, 160 ms an
# iteration), so their minute does not take a core from the rest of the suite.
LONG = ("iterations=10000000", "data=loader", "data.num_workers=0", "data.item_delay_ms=20")


@dataclass
class Sweep:
    """`python run.py -m ...` submitting to the cluster, in the background; its output in files."""

    name: str
    folder: Path
    overrides: tuple[str, ...]
    env: dict[str, str]
    proc: Forked | None = None
    code: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def start(self) -> Sweep:
        self.folder.mkdir(parents=True)
        self.proc = RUN_PY.start(["run.py", "-m", *self.overrides, ONE_ROUND, f"hydra.sweep.dir={self.folder / 'sweep'}"],
                                 self.env, out=self.folder.parent / f"{self.name}.out",
                                 err=self.folder.parent / f"{self.name}.err")
        return self

    @property
    def sweep(self) -> Path:
        return self.folder / "sweep"

    @property
    def stdout(self) -> str:
        return (self.folder.parent / f"{self.name}.out").read_text()

    @property
    def stderr(self) -> str:
        return (self.folder.parent / f"{self.name}.err").read_text()

    def job_id(self, timeout: float = START_S) -> str:
        """The array job's id: submitit's folder for it, `.submitit/<id>/`, appears once sbatch answered."""
        wait_until(lambda: any(p.name.isdigit() for p in self.sweep.glob(".submitit/*")), timeout, self.describe)
        return next(p.name for p in self.sweep.glob(".submitit/*") if p.name.isdigit())

    def results(self) -> dict[str, dict[str, Any]]:
        return {p.parent.name: json.loads(p.read_text()) for p in self.sweep.glob("*/results.json")}

    def job_logs(self) -> str:
        return "".join(p.read_text() for p in sorted(self.sweep.glob(".submitit/*/*_log.*")))

    def describe(self) -> str:
        return (f"{self.name}: exit {self.proc.poll() if self.proc else None}\n--- stdout ---\n"
                f"{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-3000:]}\n--- job logs ---\n"
                f"{self.job_logs()[-3000:]}")


def wait_until(condition: Any, timeout: float, describe: Any = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s\n{describe()}")
        time.sleep(0.5)


def report_rows(report_md: str) -> dict[str, str]:
    """{combination: "ok", or "<status>: <reason>"} from the sweep's report.md."""
    return report_statuses(report_md)


@pytest.fixture(scope="session")  # module scope is torn down when xdist runs another module's test between
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    slurm = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield slurm
    finally:
        slurm.stop()


@pytest.fixture(scope="session")
def outcome(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Everything at once; the scancels as the jobs get to where they should. Returns the sweeps and the
    multi-node job, all ended."""
    base = tmp_path_factory.mktemp("sweeps")
    env = cluster.env()
    began = time.monotonic()
    # The longest first, alone until it has measured a window: SLURM's warning comes 30-60 s into the job.
    timeout = Sweep("timeout", base / "timeout", (*LAUNCHER, "strategy=single", *LONG,
                                                   f"hydra.launcher.timeout_min={TIMEOUT_MIN}",
                                                   f"hydra.launcher.signal_delay_s={SIGNAL_DELAY_S}"), env).start()
    timeout_log = timeout.sweep / "0_single_O0" / "run.log"
    wait_until(lambda: timeout_log.exists() and "iter " in timeout_log.read_text(), START_S, timeout.describe)
    ok = Sweep("ok", base / "ok", (*LAUNCHER, "strategy=single,ddp", "iterations=20"), env).start()
    search = Sweep("search", base / "search", (*LAUNCHER, "search=true", "strategy=single", "search.axes=[strategy]",
                                               "grad_accum=1,2", "iterations=20", "search.budget_s=1",
                                               "timing.busy_share=1"), env).start()  # never "busy": the other jobs
    # One job at a time (%1): the second waits while the first runs, and is cancelled before it starts.
    cancel = Sweep("cancel", base / "cancel", (*LAUNCHER, "strategy=single,ddp", *LONG,
                                               "hydra.launcher.array_parallelism=1", "hydra.sweeper.max_batch_size=2"),
                   env).start()
    run_dir = base / "torchrun" / "run"
    multinode = cluster.run(
        "sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--time=10",
        f"--output={base / 'torchrun.out'}", f"--chdir={REPO}",
        f"--export=ALL,RDZV_PORT={free_port()},RUN_DIR={run_dir},PYTHON={sys.executable}",
        str(REPO / "scripts" / "slurm_torchrun.sbatch"), "strategy=ddp", *TINY, "iterations=20", "log_every=10",
    ).stdout.strip()

    array = cancel.job_id()
    cluster.run("scancel", f"{array}_1")  # still pending behind the %1 limit
    cancel.notes["pending_state"] = cluster.job_state(f"{array}_1")
    log = cancel.sweep / "0_single_O0" / "run.log"
    wait_until(lambda: log.exists() and "iter " in log.read_text(), START_S, cancel.describe)
    cancel.notes["cancelled_at"] = time.time()
    cluster.run("scancel", f"{array}_0")

    for sweep in (ok, search, cancel, timeout):
        try:
            sweep.code = sweep.proc.wait(START_S + 120)
        except subprocess.TimeoutExpired:
            sweep.proc.kill()
            raise AssertionError(sweep.describe()) from None
    wait_until(lambda: cluster.job_state(multinode) not in ("PENDING", "RUNNING", "COMPLETING"), START_S,
               lambda: (base / "torchrun.out").read_text())
    return {"ok": ok, "search": search, "cancel": cancel, "timeout": timeout, "multinode": multinode, "run_dir": run_dir,
            "multinode_out": base / "torchrun.out", "took_s": time.monotonic() - began}


def test_a_two_strategy_sweep_runs_as_slurm_jobs_and_the_submitting_process_reports(cluster, outcome):
    ok: Sweep = outcome["ok"]
    assert ok.code == 0, ok.describe()
    results = ok.results()
    assert sorted(results) == ["0_single_O0", "1_ddp_O0"], ok.describe()
    assert all(r["status"] == "ok" for r in results.values()), {k: r["error"] for k, r in results.items()}
    assert results["1_ddp_O0"]["world_size"] == 2 and len(results["0_single_O0"]["windows"]) == 2
    # Each was a task of one SLURM array job that slurmctld ran to completion.
    array = ok.job_id()
    assert [cluster.job_state(f"{array}_{i}") for i in (0, 1)] == ["COMPLETED", "COMPLETED"]
    assert f"Starting with JobEnvironment(job_id={array}_0" in ok.job_logs()
    # The report came from the submitting process once both had ended, not from a job.
    assert f"report: {ok.sweep / 'index.html'}" in ok.stdout and "report: " not in ok.job_logs()
    assert report_rows((ok.sweep / "report.md").read_text()) == {"single O0": "ok", "ddp O0": "ok"}


def test_a_search_runs_its_candidates_as_slurm_jobs_and_answers_in_the_submitting_process(cluster, outcome):
    """`-m search=true` on SLURM: the same rounds sweeper, each candidate a task of an array job (one round here,
    the module's sweeps' `repeat=1`)."""
    search: Sweep = outcome["search"]
    assert search.code == 0, search.describe()
    results = search.results()
    assert len(results) == 2 and all(r["status"] == "ok" for r in results.values()), search.describe()
    record = json.loads((search.sweep / "search.json").read_text())
    assert record["space"] == 2 and record["runs"] == 2 and record["ended_at"] is not None
    answer = json.loads((search.sweep / "report.json").read_text())["search"]
    assert answer["best"] is not None and answer["command"].startswith("python run.py ") and "grad_accum=" in \
        answer["command"] and "hydra" not in answer["command"], answer
    assert f"Starting with JobEnvironment(job_id={search.job_id()}_" in search.job_logs()
    assert "Search: " in search.stdout and "Search: " not in search.job_logs()


def test_a_cluster_without_accounting_is_said_once_not_at_every_poll(outcome):
    for sweep in (outcome["ok"], outcome["cancel"], outcome["timeout"]):
        text = sweep.stdout + sweep.stderr
        assert "Bypassing sacct error" not in text and "accounting storage is disabled\n" not in text, sweep.describe()
        assert text.count("keeps no accounting") == 1, sweep.describe()


def test_a_job_cancelled_mid_run_is_recorded_interrupted_and_the_sweep_still_reports(cluster, outcome):
    cancel: Sweep = outcome["cancel"]
    assert cancel.code == 0, cancel.describe()
    results = cancel.results()
    stopped = results["0_single_O0"]
    assert stopped["status"] == "interrupted" and "SIGTERM" in stopped["error"], stopped["error"]
    ends = [w["end_iter"] for w in stopped["windows"]]
    assert ends and ends == list(range(10, 10 * len(ends) + 1, 10)), ends  # every window it measured
    # It stopped on scancel's SIGTERM, well within KillWait (30 s here, as SLURM's default), on its own.
    assert stopped["finished_at"] - cancel.notes["cancelled_at"] < 30
    assert "Job completed successfully" in cancel.job_logs()
    # The job cancelled before it started left no result, and squeue lists it CANCELLED or (slurmctld had
    # not split it from the array's pending record yet) not at all: the submitting process wrote its row.
    assert cancel.notes["pending_state"] in ("", "CANCELLED")
    never = results["1_ddp_O0"]
    assert never["status"] == "failed", never
    assert never["error"] in (f"the SLURM job {cancel.job_id()}_1 ended without a result (state: {state})"
                              for state in ("CANCELLED", "ended, no longer listed by squeue")), never["error"]
    assert report_rows((cancel.sweep / "report.md").read_text()) == {
        "single O0": f"interrupted: {stopped['error']}", "ddp O0": f"failed: {never['error']}"}


def test_a_job_at_its_time_limit_stops_on_slurms_warning_and_leaves_its_partial_results(cluster, outcome):
    timeout: Sweep = outcome["timeout"]
    assert timeout.code == 0, timeout.describe()
    array = timeout.job_id()
    script = (timeout.sweep / ".submitit" / array / f"{array}_submission.sh").read_text()
    assert f"#SBATCH --time={TIMEOUT_MIN}\n" in script and f"#SBATCH --signal=USR2@{SIGNAL_DELAY_S}\n" in script
    record = timeout.results()["0_single_O0"]
    assert record["status"] == "interrupted" and "SIGUSR2" in record["error"] and "time limit" in record["error"]
    logged = re.findall(r"\[single O0\] iter +(\d+)/", (timeout.sweep / "0_single_O0" / "run.log").read_text())
    assert logged and [w["end_iter"] for w in record["windows"]] == [int(i) for i in logged]  # all it measured
    # It ended by itself on the warning, before SLURM's kill (at the first check after the time limit).
    assert "Job completed successfully" in timeout.job_logs()
    assert cluster.job_state(array) == "COMPLETED", (  # one combination: a plain job, not an array
        f"results written {record['finished_at'] - record['started_at']:.1f} s after the run started\n"
        f"{cluster.run('scontrol', 'show', 'job', array, check=False).stdout}\n{timeout.describe()}")
    rows = report_rows((timeout.sweep / "report.md").read_text())
    assert rows == {"single O0": f"interrupted: {record['error']}"}


def test_the_sbatch_recipe_runs_torchrun_per_task_meeting_at_the_first_host(cluster, outcome):
    job, out = outcome["multinode"], outcome["multinode_out"].read_text()
    assert cluster.job_state(job) == "COMPLETED", out
    assert re.search(rf"job {job}: 2 torchrun agents x 1 workers, rendezvous at {cluster.node}:\d+,", out), out
    results = json.loads((outcome["run_dir"] / "results.json").read_text())  # hydra.run.dir as the script set it
    assert results["status"] == "ok", results["error"]
    assert (results["world_size"], results["nodes"]) == (2, 2)  # each srun task a torchrun "node"
    assert results["devices"] == ["node0/cpu:0", "node1/cpu:1"]
    assert len({r["pid"] for r in results["ranks"]}) == 2

