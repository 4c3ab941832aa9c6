"""harness/launch/checked.py: the sweeper launches the combinations checked before Hydra started, a job runs the
plan made for its combination, in its round, and nothing is expanded, parsed, placed or resolved again on the way
from the command line to the trainer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CLI_TIMEOUT_S, ONE_ROUND, TINY, describe, run_config

from harness.launch import checked
from harness.launch.checked import Checked, key_of

ROOT = Path(__file__).resolve().parents[1]


def test_a_combination_is_the_same_whatever_the_order_its_round_or_hydra_s_folder():
    a = key_of(["strategy=ddp", "amp=O1", "round=3", "place=2", "after=0", "hydra.sweep.subdir='round-3/0_ddp_O1'"])
    assert a == key_of(["amp=O1", "strategy=ddp"]) == ("amp=O1", "strategy=ddp")
    assert a == key_of(["hydra/launcher=basic", "amp=O1", "+hydra.job.env_set.X=1", "strategy=ddp"])  # Hydra's own
    assert key_of(["strategy=ddp", "amp=O2"]) != a


def test_a_job_finds_its_plan_by_its_combination_in_its_round(monkeypatch):
    """Found by its overrides alone, not by comparing what Hydra composed for the job with what was checked;
    only with HARNESS_COMPARE_COMPOSITION set (the tests' debug mode) does a differing composition raise."""
    cfg = run_config()
    resolved = {"round": None, "batch_size": cfg.batch_size}
    checked.forget_all()
    try:
        checked.remember(["strategy=single"], Checked(cfg, resolved))
        found = checked.find(["strategy=single", "round=2"], {"round": 2, "batch_size": cfg.batch_size})
        assert found is not None and found.config.round == 2 and found.resolved["round"] == 2
        placed = checked.find(["strategy=single", "round=3", "place=2", "after=4"],
                              {"round": 3, "place": 2, "after": 4, "batch_size": cfg.batch_size})
        assert placed is not None and (placed.config.place, placed.config.after, placed.resolved["place"]) == (2, 4, 2)
        assert checked.find(["strategy=ddp"], resolved) is None
        other = {"round": None, "batch_size": cfg.batch_size + 1}  # e.g. conf/ edited since: what was checked runs
        monkeypatch.delenv(checked.COMPARE_ENV, raising=False)
        assert checked.find(["strategy=single"], other).config.batch_size == cfg.batch_size
        monkeypatch.setenv(checked.COMPARE_ENV, "1")
        with pytest.raises(AssertionError, match="batch_size"):
            checked.find(["strategy=single"], other)
        assert checked.find(["strategy=single", "round=2"], {"round": 2, "batch_size": cfg.batch_size}) is not None
    finally:
        checked.forget_all()


def test_the_sweeper_gets_the_checked_combinations_in_order_only_for_the_sweep_checked():
    """The pre-check's order, with Hydra's own overrides left out as Hydra's grid leaves them out; nothing for
    another command line, for a command checked without a sweep, or once forgotten."""
    cfg = run_config()
    command = ["strategy=single,ddp", "amp=O0,O1", "hydra.sweep.dir=x", "hydra/launcher=basic"]
    grid = [["strategy=single", "amp=O0", "hydra.sweep.dir=x", "hydra/launcher=basic"],
            ["strategy=single", "amp=O1", "hydra.sweep.dir=x", "hydra/launcher=basic"],
            ["strategy=ddp", "amp=O0", "hydra.sweep.dir=x", "hydra/launcher=basic"],
            ["strategy=ddp", "amp=O1", "hydra.sweep.dir=x", "hydra/launcher=basic"]]
    checked.forget_all()
    try:
        for combo in grid:
            checked.remember(combo, Checked(cfg, {}))
        assert checked.combinations(command[:2]) is None  # remembered, but no sweep said to be theirs
        checked.remember_sweep(command)
        assert checked.combinations(command[:2]) == [c[:2] for c in grid]
        assert checked.combinations(["strategy=single,ddp", "amp=O0,O2"]) is None
        checked.forget_all()
        assert checked.combinations(command[:2]) is None
    finally:
        checked.forget_all()


COUNTING = """
import json, os, runpy, sys
import hydra
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from harness import compose
from harness.core.config import RunConfig
from harness.launch import checked, decide
calls = []
compose_api, expand, job_config = hydra.compose, compose.expand, ConfigLoaderImpl.load_sweep_config
from_dict, run_plan, settings = RunConfig.from_dict.__func__, decide.run_plan, checked.sweep_settings

def amp_of(overrides):
    return " ".join(o for o in overrides if o.startswith("amp="))

hydra.compose = lambda *a, overrides=(), **k: calls.append(f"compose {amp_of(overrides)}".strip()) or \
    compose_api(*a, overrides=overrides, **k)
compose.expand = lambda *a: calls.append("expand") or expand(*a)
ConfigLoaderImpl.load_sweep_config = lambda self, c, o: calls.append(f"job {amp_of(o)}") or job_config(self, c, o)
RunConfig.from_dict = classmethod(lambda cls, *a, **k: calls.append("from_dict") or from_dict(cls, *a, **k))
decide.run_plan = lambda *a, **k: calls.append("run_plan") or run_plan(*a, **k)
checked.sweep_settings = lambda c: calls.append(f"budget {settings(c).timing.budget_s:g}") or settings(c)
os.environ[checked.COMPARE_ENV] = "1"  # each job's composition asserted equal to the one checked
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("CALLS " + json.dumps(calls))
"""


@pytest.mark.slow
def test_a_sweep_expands_composes_parses_and_plans_each_combination_once(tmp_path):
    """run.py as a user runs it (in a process that counts the calls): the grid is expanded once (the pre-check's;
    the sweeper launches what it checked); each of its two combinations is composed once by the pre-check (the
    other composition, without `amp=`, reads conf/sweep/'s grid), checked (RunConfig.from_dict) and planned
    (run_plan) once, before Hydra starts; Hydra composes each job once more, for its `.hydra/` and folder only,
    which equals what was checked; each job runs its plan, and the sweep's rounds read the typed budget."""
    proc = subprocess.run([sys.executable, "-c", COUNTING, str(ROOT / "run.py"), "-m", "strategy=single", "amp=O0,O1",
                           *TINY, ONE_ROUND, "iterations=20", "log_every=10", "plan.predict=false", "timing.budget_s=77",
                           f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, describe(proc)
    results = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.rglob("results.json")}
    assert {name: r["status"] for name, r in results.items()} == {"0_single_O0": "ok", "1_single_O1": "ok"}
    calls = json.loads(proc.stdout.rpartition("CALLS ")[2])
    assert sorted(calls) == ["budget 77", "compose", "compose amp=O0", "compose amp=O1", "expand",
                             "from_dict", "from_dict", "job amp=O0", "job amp=O1", "run_plan", "run_plan"], calls
    sweep = calls.index("budget 77")  # everything before it happened before the sweep began
    assert sorted(calls[:sweep]) == ["compose", "compose amp=O0", "compose amp=O1", "expand",
                                     "from_dict", "from_dict", "run_plan", "run_plan"], calls
    assert calls[sweep + 1:] == ["job amp=O0", "job amp=O1"]  # the jobs: Hydra's composition, nothing checked
