"""harness/launch/checked.py: a job runs the plan made for its combination before Hydra started, in its round,
and nothing is parsed, placed or resolved again on the way from the command line to the trainer."""

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
    assert key_of(["strategy=ddp", "amp=O2"]) != a


def test_a_job_finds_its_plan_in_its_round_and_only_for_the_config_that_was_checked():
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
        assert checked.find(["strategy=single"], {"round": None, "batch_size": cfg.batch_size + 1}) is None
        assert checked.find(["strategy=ddp"], resolved) is None
    finally:
        checked.forget_all()


COUNTING = """
import json, runpy, sys
from harness.core.config import RunConfig
from harness.launch import checked, decide
calls = []
from_dict, run_plan, settings = RunConfig.from_dict.__func__, decide.run_plan, checked.sweep_settings
RunConfig.from_dict = classmethod(lambda cls, *a, **k: calls.append("from_dict") or from_dict(cls, *a, **k))
decide.run_plan = lambda *a, **k: calls.append("run_plan") or run_plan(*a, **k)
checked.sweep_settings = lambda c: calls.append(f"budget {settings(c).timing.budget_s:g}") or settings(c)
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("CALLS " + json.dumps(calls))
"""


@pytest.mark.slow
def test_a_sweep_parses_and_plans_each_combination_once(tmp_path):
    """run.py as a user runs it (in a process that counts the calls): each of the command line's two
    combinations is checked (RunConfig.from_dict) and planned (run_plan) once, before Hydra starts; each job runs
    its plan, and the sweep's rounds read the typed budget from them."""
    proc = subprocess.run([sys.executable, "-c", COUNTING, str(ROOT / "run.py"), "-m", "strategy=single", "amp=O0,O1",
                           *TINY, ONE_ROUND, "iterations=20", "log_every=10", "plan.predict=false", "timing.budget_s=77",
                           f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, describe(proc)
    results = [json.loads(p.read_text()) for p in tmp_path.rglob("results.json")]
    assert sorted(r["amp"] for r in results if r["status"] == "ok") == ["O0", "O1"], describe(proc)
    calls = json.loads(proc.stdout.rpartition("CALLS ")[2])
    assert sorted(calls) == ["budget 77", "from_dict", "from_dict", "run_plan", "run_plan"]
    assert calls[-1] == "budget 77"  # both planned before the sweep began
