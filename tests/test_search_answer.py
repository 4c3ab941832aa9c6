"""harness.search.answer: the search's answer sentence and its cost against the full grid, by hand."""

from __future__ import annotations

from types import SimpleNamespace

from harness.search.answer import answer, cost_words
from harness.search.record import SearchRecord
from harness.verdict.racing import Standing
from harness.verdict.rule import Judgement


def record(**fields: object) -> SearchRecord:
    return SearchRecord(space=4, kept=[], kept_names=[], **fields)  # type: ignore[arg-type]


def test_the_cost_is_the_searchs_time_beside_the_grids_at_the_same_pace_per_run():
    """6 runs in 80 s: 13.3 s a run. The grid, 4 combinations x 2 rounds = 8 runs, would take 8 x 13.3 = 107 s,
    of which the search took 80 / 107 = 75 %. (Dividing by the space's 4 instead of the 6 runs would say 160 s
    and 50 %.)"""
    said = cost_words(record(started_at=1000.0, ended_at=1080.0, runs=6, rounds=2, ended_by="decided"))
    assert said == ("6 runs in 80 s (2 rounds, decided); the grid: 4 combinations x 2 rounds = 8 runs, about 107 s "
                    "at this search's pace per run (the search took 75 % of it)")
    # three rounds raced: the grid is counted over as many rounds, and minutes past two of them
    longer = cost_words(record(started_at=0.0, ended_at=600.0, runs=10, rounds=3, ended_by="budget"))
    assert longer.endswith("the grid: 4 combinations x 3 rounds = 12 runs, about 12.0 min at this search's pace per "
                           "run (the search took 83 % of it)")


def test_the_answer_names_the_winner_its_margin_over_the_runner_up_and_the_command():
    rows = [SimpleNamespace(label=label, status="ok", throughput=rate, reason=None, overrides=overrides, runs=2)
            for label, rate, overrides in (("ddp O1", 900.0, ["strategy=ddp", "amp=O1", "search.budget_s=60",
                                                               "round=2"]),
                                           ("single O0", 500.0, ["strategy=single", "amp=O0"]))]
    margin = Judgement(1.8, 1.5, 2.2, 2, 0.05, 1, 0.05, "faster")
    state = Standing("ddp O1", "single O0", margin, decided="winner")
    said = answer(record(started_at=0.0, ended_at=40.0, runs=4, rounds=2, ended_by="decided"), rows, state, 0.05,
                  lambda r: f"{r.throughput:.1f} img/s")
    assert said.sentence == ("ddp O1 is the fastest configuration found, 900.0 img/s, 1.80x [1.50–2.20] the runner-up "
                             "single O0")
    assert said.best == "ddp O1" and said.decided == "winner"
    assert said.command == "python run.py strategy=ddp amp=O1"  # the search's own settings left out
