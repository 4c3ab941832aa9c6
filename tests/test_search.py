"""`python run.py -m search=true` (harness/search/): bad input refused in one line before anything starts, and a
real search of a tiny space whose best is known (the largest micro-batch, at the same global batch) with a
candidate that crashes: the search goes on, and the answer names the best, the command that trains with it,
what failed and what it cost."""

from __future__ import annotations

import json
import signal

import pytest
from conftest import START_TIMEOUT_S, STOP_BOUND_S, TINY, LiveRun, describe, run_sweep

from harness import cli


@pytest.mark.parametrize(("overrides", "line"), [
    (("search.axes=[strategy,precision]",), "error: search.axes=[strategy,precision] is not allowed: a list of "
                                            "distinct axes from strategy, amp, micro_batch"),
    (("search.budget_s=0",), "error: search.budget_s=0 is not allowed: a number of seconds > 0"),
    (("search.prune_factor=0.5",), "error: search.prune_factor=0.5 is not allowed: a number >= 1"),
])
def test_bad_search_input_is_one_line_and_exit_2(overrides, line, capsys):
    with pytest.raises(SystemExit) as info:
        cli.precheck(["-m", "search=true", *TINY, "plan.predict=false", *overrides])
    lines = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == cli.EXIT_BAD_INPUT and len(lines) == 1, lines
    assert lines[0].startswith(line), lines


def test_a_search_without_multirun_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        cli.precheck(["search=true", *TINY, "plan.predict=false"])
    assert info.value.code == cli.EXIT_BAD_INPUT
    assert "error: search=true is not allowed: with -m" in capsys.readouterr().err


def test_a_space_where_nothing_fits_is_refused_before_anything_runs(tmp_path, capsys):
    """Every candidate predicted to need far more than this machine's memory: nothing to search."""
    sweep = tmp_path / "sweep"
    with pytest.raises(SystemExit) as info:
        cli.precheck(["-m", "search=true", "strategy=single", "search.axes=[micro_batch]", "model=tiny_cnn",
                      "data.image_size=512", "batch_size=65536", "plan.predict=true", f"hydra.sweep.dir={sweep}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == cli.EXIT_BAD_INPUT and len(lines) == 1, lines
    assert lines[0].startswith("error: search=true is not allowed: a space with a combination predicted to fit: all 3 "
                               "were predicted not to"), lines
    assert not sweep.exists()


@pytest.mark.slow
def test_a_tiny_search_finds_the_larger_micro_batch_and_goes_on_past_a_crash(tmp_path):
    """One process, a global batch of 64 as one micro-batch or eight of 8 (eight times the steps' overhead for the
    same samples: the larger is clearly faster, 4-5x here, so even beside a loaded machine), each also with an
    injected crash."""
    sweep = tmp_path / "sweep"
    proc = run_sweep("search=true", "strategy=single", "search.axes=[strategy]", "grad_accum=1,8",
                     "fault.kind=null,raise", "fault.at_iter=5", "model=tiny_cnn", "data.image_size=8", "batch_size=64",
                     "iterations=40", "log_every=10", "plan.predict=false", "search.budget_s=1", "repeat=null",
                     "timing.busy_share=1", sweep_dir=sweep)  # the suite's other worker never makes a run "busy"
    assert proc.returncode == 0, describe(proc)
    record = json.loads((sweep / "search.json").read_text())
    assert record["space"] == 4 and len(record["kept"]) == 4 and record["ended_at"] is not None
    report = json.loads((sweep / "report.json").read_text())["search"]
    # the best, decided (a 2.8x difference here) or leading where two rounds cannot decide
    assert report["best"] == "single O0 fault.kind=None" and report["sentence"].startswith(report["best"]), report
    assert "grad_accum=8" not in report["command"]
    assert report["decided"] in ("winner", None)
    assert report["command"].startswith("python run.py ") and "grad_accum=1" in report["command"]
    assert "search" not in report["command"] and "hydra." not in report["command"]
    assert not any(w.startswith(("round=", "place=", "after=")) for w in report["command"].split())  # the sweep's
    assert sorted(name for name, _ in report["failed"]) and all("injected fault" in why for _, why in report["failed"])
    assert len(report["failed"]) == 2
    assert report["cost"].startswith("6 runs in ") and "the grid: 4 combinations x 2 rounds = 8 runs" in report["cost"]
    assert "Never started" not in (sweep / "report.md").read_text()
    text = (sweep / "report.md").read_text()
    assert text.index("## Search") < text.index("**Verdict:**")
    assert "Search: " in proc.stdout


@pytest.mark.slow
def test_ctrl_c_ends_a_search_with_the_answer_from_what_finished(tmp_path):
    """Two candidates, the second one endless: SIGINT while it trains ends the search within the bound, and the
    answer is the finished one's, said as partial; nothing of the run is left."""
    sweep = tmp_path / "sweep"
    first = sweep / "0_single_O0_iterations-40" / "results.json"
    with LiveRun("-m", "search=true", "strategy=single", "amp=O0", "grad_accum=1", "iterations=40,100000", *TINY,
                 "log_every=20", "plan.predict=false", "launcher.start_method=forkserver",
                 "timing.busy_share=1",  # the suite's other worker never makes the finished run "busy"
                 f"hydra.sweep.dir={sweep}") as run:
        assert run.wait_until(lambda: first.exists() and "/100000 " in run.stdout, START_TIMEOUT_S), run.describe()
        sent = run.signal(signal.SIGINT)
        code = run.wait(timeout=STOP_BOUND_S + 60)
    assert code == 130 and run.ended_at - sent < STOP_BOUND_S, run.describe()
    record = json.loads((sweep / "search.json").read_text())
    assert record["ended_at"] is None and record["space"] == 2
    answer = json.loads((sweep / "report.json").read_text())["search"]
    assert answer["sentence"].startswith("interrupted before it ended; from what finished: single O0 "), answer
    assert answer["best"] is not None and "iterations=40" in answer["command"]
    assert "interrupted before it ended" in answer["cost"]
    assert not run.survivors(grace=10)


def test_the_training_command_leaves_out_what_the_sweep_set():
    """A run's overrides as the rounds sweeper gave them: the training command keeps only the user's settings."""
    from harness.search.answer import training_command

    overrides = ["strategy=ddp", "amp=O0", "grad_accum=1", "search.enabled=true", "sweep=none", "round=3", "place=2",
                 "after=0", "hydra.sweep.subdir='round-3/0_ddp_O0'"]
    assert training_command(overrides) == "python run.py strategy=ddp amp=O0 grad_accum=1"
