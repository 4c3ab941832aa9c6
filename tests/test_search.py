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
    """One process, a global batch of 64 as one micro-batch or 32 of 2, each also with an injected crash.

    The busy detection stays on (the suite's other worker loads this 2-core machine), so what is asserted holds
    whichever runs it marks busy. A run is left out where others took a fifth of the cores during its steady
    windows, judged only where those last a second in all. The 32 micro-batches' 140 steady iterations take over
    two seconds here even on an idle machine (about 4,200 img/s): always judged. The one micro-batch's take a
    tenth of a second (about 65,000 img/s); where a pause leaves them unjudged, under a second, that is still
    over 8,960 img/s, twice the other's best. So whenever both were measured on a quiet machine the one
    micro-batch is the faster (and under heavy load, busy, it can be the slower: its batch of 64 spreads over
    threads that the load keeps waiting). The answer is the fastest candidate measured on a quiet machine: the
    larger micro-batch wherever it was; where it was measured only while busy, the other, alone, and the row says
    why; where neither was, nothing."""
    sweep = tmp_path / "sweep"
    proc = run_sweep("search=true", "strategy=single", "search.axes=[strategy]", "grad_accum=1,32",
                     "fault.kind=null,raise", "fault.at_iter=5", "model=tiny_cnn", "data.image_size=8", "batch_size=64",
                     "iterations=160", "log_every=20", "plan.predict=false", "search.budget_s=1", "repeat=null",
                     sweep_dir=sweep, timeout=400, one_core=True)  # two threads beside a busy core: 12x slower
    assert proc.returncode == 0, describe(proc)
    record = json.loads((sweep / "search.json").read_text())
    assert record["space"] == 4 and len(record["kept"]) == 4 and record["ended_at"] is not None
    page = json.loads((sweep / "report.json").read_text())
    report, rows = page["search"], {row["label"]: row for row in page["rows"]}
    large, small = "single O0 fault.kind=None", "single O0 fault.kind=None grad_accum=32"
    # every timed run was judged quiet or busy, and each row counts the busy ones it left out
    ok = [run for path in sweep.rglob("results.json") if (run := json.loads(path.read_text()))["status"] == "ok"]
    assert len(ok) == 4 and all(isinstance(run["machine"]["busy"], bool) for run in ok), ok
    for label, accum in ((large, 1), (small, 32)):
        busy = sum(run["machine"]["busy"] for run in ok if run["config"]["grad_accum"] == accum)
        assert rows[label]["busy_runs"] == busy and bool(rows[label]["busy"]) == (busy == 2), rows[label]
    quiet = [label for label in (large, small) if rows[label]["run_throughputs"]]
    if large in quiet:  # nearly always: its windows are too short to be judged unless a pause of a second hit them
        # the best, decided or leading where two rounds cannot decide; alone where the other was only busy
        assert report["best"] == large and report["decided"] in (("winner", None) if small in quiet else ("alone",))
    elif quiet:  # measured only while the machine was busy: not judged, and said so
        assert report["best"] == small and report["decided"] == "alone" and rows[large]["busy"], report
    else:
        assert report["best"] is None and report["command"] is None, report
        assert report["sentence"].startswith("no candidate measured a throughput on a quiet machine"), report
    if report["best"] is not None:
        assert report["sentence"].startswith(report["best"]), report
        accum = "grad_accum=32" if report["best"] == small else "grad_accum=1"
        assert report["command"].startswith("python run.py ") and accum in report["command"].split(), report
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
    answer is the finished one's, said as partial; nothing of the run is left. The busy detection stays on: the
    finished run's windows (hundredths of a second) are judged only where a pause of a second hit them, and a
    finished run judged busy leaves nothing to recommend, which the answer says, still as partial."""
    sweep = tmp_path / "sweep"
    first = sweep / "0_single_O0_iterations-40" / "results.json"
    with LiveRun("-m", "search=true", "strategy=single", "amp=O0", "grad_accum=1", "iterations=40,100000", *TINY,
                 "log_every=20", "plan.predict=false", "launcher.start_method=forkserver",
                 f"hydra.sweep.dir={sweep}") as run:
        assert run.wait_until(lambda: first.exists() and "/100000 " in run.stdout, START_TIMEOUT_S), run.describe()
        sent = run.signal(signal.SIGINT)
        code = run.wait(timeout=STOP_BOUND_S + 60)
    assert code == 130 and run.ended_at - sent < STOP_BOUND_S, run.describe()
    record = json.loads((sweep / "search.json").read_text())
    assert record["ended_at"] is None and record["space"] == 2
    answer = json.loads((sweep / "report.json").read_text())["search"]
    if json.loads(first.read_text())["machine"]["busy"]:
        assert answer["best"] is None and answer["sentence"] == ("interrupted before it ended; from what finished: no "
                                                                 "candidate measured a throughput on a quiet machine: "
                                                                 "nothing can be recommended"), answer
    else:
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
