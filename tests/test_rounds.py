"""harness/verdict/racing.py and rounds.py with a fake launcher whose throughputs are set by hand (interleaving,
racing, the budget, repeat=N), and one real sweep in rounds (folders, the report's verdict)."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import pytest

from harness.core.results import SCHEMA, MachineLoad, RunRecord
from harness.verdict.intervals import Fit, Observation
from harness.verdict.racing import standing
from harness.verdict.rounds import balanced_order, round_overrides, run_rounds, starting_after, williams
from tests.conftest import TINY, run_config, run_sweep

TEMPLATE = "${hydra.job.num}_${hydra.runtime.choices.strategy}_${amp.level}"
COMBOS = [["strategy=a"], ["strategy=b"], ["strategy=c"]]


class FakeLaunch:
    """Each combination's throughput in each round, by hand; records the order jobs ran in. `seconds` is
    what each job takes on the fake clock."""

    def __init__(self, rates: dict[int, list[float]], seconds: float = 1.0, busy: set[tuple[int, int]] = frozenset(),
                 status: dict[int, str] | None = None) -> None:
        self.rates, self.seconds, self.busy, self.status = rates, seconds, busy, status or {}
        self.now = 0.0
        self.ran: list[tuple[int, int]] = []  # (combination, round)
        self.jobs: list[list[str]] = []

    def clock(self) -> float:
        return self.now

    def __call__(self, jobs: list[list[str]], first: int) -> list[RunRecord | None]:
        out = []
        for job in jobs:
            combo = next(i for i, c in enumerate(COMBOS) if job[:len(c)] == c)
            number = int(next(o for o in job if o.startswith("round=")).partition("=")[2])
            self.ran.append((combo, number))
            self.jobs.append(job)
            self.now += self.seconds
            out.append(RunRecord(schema=SCHEMA, status=self.status.get(combo, "ok"), strategy=f"s{combo}", amp="O0",
                                 model="m", throughput_img_s=self.rates[combo][number - 1], round=number,
                                 machine=MachineLoad(busy=(combo, number) in self.busy)))
        return out


def rounds_of(ran: list[tuple[int, int]]) -> list[list[int]]:
    """The combinations each round ran (in order of combination; the run order is a Williams design's)."""
    by_round: dict[int, list[int]] = {}
    for combo, number in ran:
        by_round.setdefault(number, []).append(combo)
    return [sorted(by_round[n]) for n in sorted(by_round)]


def test_every_combination_runs_once_before_any_runs_again_and_later_rounds_have_folders_of_their_own():
    launch = FakeLaunch({0: [100, 101, 99, 100], 1: [100, 99, 101, 100], 2: [100, 100, 100, 101]})
    outcome = run_rounds(COMBOS, launch, repeat=4, budget_s=1.0, subdir_template=TEMPLATE, describe=str,
                         clock=launch.clock)
    # a Williams design for 3 rows: A B C, B C A, C A B (each row once in each place), then the mirror, C B A, ...
    orders = [[0, 1, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]]
    assert launch.ran == [(c, n) for n, order in enumerate(orders, start=1) for c in order]
    assert outcome.orders == orders
    assert outcome.ended_by == "repeat" and outcome.rounds == 4 and outcome.runs == 12  # repeat=N: N, budget or not
    # round 1: Hydra's own folder (job number = combination); each job says its place and the combination before it
    assert launch.jobs[0] == ["strategy=a", "round=1", "place=1"]
    assert launch.jobs[3] == ["strategy=b", "round=2", "place=1", "after=2",
                              "hydra.sweep.subdir='round-2/1_${hydra.runtime.choices.strategy}_${amp.level}'"]
    assert launch.jobs[4][:4] == ["strategy=c", "round=2", "place=2", "after=1"]


@pytest.mark.parametrize("k", range(2, 13))
def test_every_row_takes_every_place_and_follows_every_other_row_equally_often(k):
    """Williams' design: over its k orders (2k for odd k) each row is in each place equally often, and each
    ordered pair of rows is adjacent equally often; the first k orders alone already balance the places."""
    design = williams(k)
    assert len(design) == (k if k % 2 == 0 else 2 * k) and all(sorted(order) == list(range(k)) for order in design)
    for orders in (design, design[:k]):
        places = {(row, place) for order in orders for place, row in enumerate(order)}
        counts = [sum(order[place] == row for order in orders) for row, place in places]
        assert len(places) == k * k and len(set(counts)) == 1
    follows = [(a, b) for order in design for a, b in zip(order, order[1:], strict=False)]
    assert len(set(follows)) == k * (k - 1) and len({follows.count(p) for p in set(follows)}) == 1


def test_the_orders_start_again_balanced_over_the_rows_racing_leaves():
    """Rows 0-3 race; after round 3 row 2 stops: from round 4 on, the design is the one for rows 0, 1 and 3, from
    its first order, so that within 3 rounds each of them has had each place."""
    assert [balanced_order([0, 1, 2, 3], n) for n in range(4)] == [[0, 1, 3, 2], [1, 2, 0, 3], [2, 3, 1, 0],
                                                                   [3, 0, 2, 1]]
    assert starting_after([0, 2], 0) == [2, 0] and starting_after([0, 2], 1) == [0, 2]  # round 1 opened with 0
    wobble = [1 + 0.03 * math.sin(2.3 * r) for r in range(40)]
    rates = {0: [100 * w for w in wobble], 1: [100 * w for w in reversed(wobble)], 2: [20 * w for w in wobble],
             3: [100 * w for w in wobble[::-1][3:] + wobble[:3]]}
    combos = [*COMBOS, ["strategy=d"]]

    class Four(FakeLaunch):
        def __call__(self, jobs, first):
            COMBOS.append(combos[3])
            try:
                return super().__call__(jobs, first)
            finally:
                COMBOS.pop()

    launch = Four(rates)
    outcome = run_rounds(combos, launch, repeat=None, budget_s=1000, subdir_template=TEMPLATE, describe=str,
                         clock=launch.clock)
    stop = outcome.stopped[2]
    after = outcome.orders[stop:stop + 3]
    # the rows left, rotated so that the round after the stop does not open with the row that opened the one before
    rows = [0, 1, 3] if outcome.orders[stop - 1][0] != 0 else [1, 3, 0]
    assert len(after) == 3 and after == [balanced_order(rows, n) for n in range(3)]
    assert after[0][0] != outcome.orders[stop - 1][0]
    assert all(sorted(order[place] for order in after) == [0, 1, 3] for place in range(3))


def test_racing_stops_what_is_slower_and_runs_the_contenders_until_decided():
    # c is half as fast, with the same noise as a; a and b are 0.2 % apart with +-0.5 % noise. Rounds take 3 s:
    # 2 + (60 - 6) // 3 = 20 are planned. The looks before the last spend next to nothing at first, so c stops
    # once its interval clears 1 at its look's level (round 3), and a and b go on until their ratio's interval
    # lies within verdict.margin: a tie
    noise = [1 + 0.005 * math.sin(1.7 * r) for r in range(40)]
    launch = FakeLaunch({0: [100 * n for n in noise], 1: [99.8 * n for n in reversed(noise)],
                         2: [50 * n for n in noise]})
    outcome = run_rounds(COMBOS, launch, repeat=None, budget_s=60, subdir_template=TEMPLATE, describe=str,
                         clock=launch.clock)
    rounds = rounds_of(launch.ran)
    stopped = outcome.stopped[2]
    assert list(outcome.stopped) == [2] and 2 < stopped < outcome.rounds
    assert all(r == [0, 1, 2] for r in rounds[:stopped]) and all(r == [0, 1] for r in rounds[stopped:])
    assert outcome.ended_by == "decided: tie"
    assert outcome.planned == 20 and outcome.rounds < outcome.planned  # decided before the plan was done


def test_the_rounds_are_planned_from_the_budget_after_the_second_never_fewer_than_two():
    # a and b alternate which is ahead by 10 %: never decided; each job takes 10 s, a round 30 s
    rates = {0: [100, 110, 100, 110, 100], 1: [110, 100, 110, 100, 110], 2: [100, 110, 100, 110, 100]}
    launch = FakeLaunch(rates, seconds=10.0)
    outcome = run_rounds(COMBOS, launch, repeat=None, budget_s=5.0, subdir_template=TEMPLATE, describe=str,
                         clock=launch.clock)
    assert (outcome.planned, outcome.rounds, outcome.ended_by) == (2, 2, "planned rounds")  # 5 s: two anyway
    launch = FakeLaunch(rates, seconds=10.0)
    outcome = run_rounds(COMBOS, launch, repeat=None, budget_s=95.0, subdir_template=TEMPLATE, describe=str,
                         clock=launch.clock)
    assert (outcome.planned, outcome.rounds, outcome.ended_by) == (3, 3, "planned rounds")  # 2 + (95 - 60) // 30
    assert outcome.round_seconds == [30.0, 30.0, 30.0]


def test_a_round_that_would_pass_the_budget_is_not_started():
    class Slowing(FakeLaunch):  # the machine slows down: round 3 takes 60 s, where the plan assumed 30
        def __call__(self, jobs: list[list[str]], first: int) -> list[RunRecord | None]:
            self.seconds = 10.0 if len(self.ran) < 6 else 20.0
            return super().__call__(jobs, first)

    launch = Slowing({0: [100, 110] * 3, 1: [110, 100] * 3, 2: [100, 110] * 3}, seconds=10.0)
    outcome = run_rounds(COMBOS, launch, repeat=None, budget_s=120.0, subdir_template=TEMPLATE, describe=str,
                         clock=launch.clock)
    # planned after round 2: 2 + (120 - 60) // 30 = 4; round 3 took 60 s, so a 4th (60 more) would end at 180
    assert outcome.planned == 4 and outcome.rounds == 3 and outcome.ended_by == "budget"


def test_failed_combinations_are_not_run_again_and_busy_runs_do_not_decide():
    launch = FakeLaunch({0: [100, 100, 100], 1: [50, 50, 50], 2: [10, 10, 10]}, status={2: "failed"},
                        busy={(1, 1), (1, 2)})
    outcome = run_rounds(COMBOS, launch, repeat=3, budget_s=1.0, subdir_template=TEMPLATE, describe=str,
                         clock=launch.clock)
    assert rounds_of(launch.ran) == [[0, 1, 2], [0, 1], [0, 1]] and outcome.runs == 7


def test_a_combination_busy_in_every_round_leaves_the_race_unjudged():
    """5x slower, but every run of it busy: never stopped on its busy figures, and not run again after round 2
    (it was re-run every round before, and never judged)."""
    launch = FakeLaunch({0: [100, 101] * 20, 1: [20] * 40, 2: [100, 99] * 20}, busy={(1, n) for n in range(1, 41)})
    outcome = run_rounds(COMBOS, launch, repeat=None, budget_s=20, subdir_template=TEMPLATE, describe=str,
                         clock=launch.clock)
    assert 1 not in outcome.stopped and outcome.busy_only == [1]
    assert (1, 2) in launch.ran and not any(c == 1 and n > 2 for c, n in launch.ran)


def test_standing_by_hand():
    """b is e times slower than a in every round (its per-round ratio has no spread: slower at any level); c is
    a's twin within 0.2 % (per-round ratios 0.002, 0, 0.002, 0: SD 0.00115 over 4 rounds, at 0.05 / 3:
    t(3) 5.84, interval +-0.34 %, within +-5 %): a tie."""
    def obs(key: str, logs: list[float]) -> list[Observation]:
        return [Observation(key, i + 1, math.exp(x)) for i, x in enumerate(logs)]

    a = [2.0, 2.02, 1.98, 2.01]
    fit = Fit(obs("a", a) + obs("b", [x - 1.0 for x in a]) + obs("c", [x - d for x, d in
                                                                       zip(a, [0.002, 0.0, 0.002, 0.0], strict=True)]))
    state = standing(fit, ["a", "b", "c"])
    assert state.leader == "a" and list(state.stopped) == ["b"] and state.tied == ("c",) and state.decided == "tie"
    assert state.stopped["b"].ratio == pytest.approx(math.exp(-1.0)) and state.stopped["b"].word == "slower"
    alone = standing(fit, ["a", "b"])
    assert alone.decided == "winner" and alone.runner_up == "b" and alone.margin.ratio == pytest.approx(math.e)
    assert standing(fit, ["a"]).decided == "alone" and standing(fit, []).leader is None


def test_round_overrides_keep_the_users_folder_pattern():
    assert round_overrides(["amp=O1"], 7, 3, "x_${hydra.job.num}") == ["amp=O1", "round=3", "hydra.sweep.subdir='round-3/x_7'"]


def test_the_sweeper_launches_the_checked_grid_in_hydras_order_and_expands_its_own_only_when_none_was_checked(
        monkeypatch):
    """A sweep's grid is expanded once: the rounds sweeper takes the combinations run.py's pre-check expanded,
    composed and checked; only for a sweep this process did not check does it expand Hydra's grid (conf/sweep/'s
    params, then the typed overrides) itself, into the same combinations in the same order (the job numbers)."""
    from harness import compose
    from harness.launch import checked
    from harness.launch.checked import Checked
    from harness.search import shortlist
    from hydra_plugins import harness_rounds_sweeper

    command = ["sweep=llm", "amp=O0", "batch_size=4,8", "hydra.sweep.dir=x", "hydra/launcher=basic"]
    arguments = command[:3]  # what Hydra hands its sweeper: the task's overrides, not its own
    with compose.hydra_context():
        prechecked = compose.combinations(command, multirun=True)
        # the class as Hydra's plugin scan (which runs its module again) left it
        sweeper = harness_rounds_sweeper.RoundsSweeper(max_batch_size=None, params=compose.composed_sweep_params(command))
    sweeper.hydra_context = SimpleNamespace(config_loader=None)
    monkeypatch.setattr(shortlist, "_CURRENT", None)
    checked.forget_all()
    hydras = sweeper.combinations(arguments)  # nothing checked here: Hydra's grid
    assert hydras == [[o for o in c if not o.startswith("hydra")] for c in prechecked]
    assert hydras[:2] == [["strategy=ddp", "model.checkpoint=False", "amp=O0", "sweep=llm", "batch_size=4"],
                          ["strategy=ddp", "model.checkpoint=False", "amp=O0", "sweep=llm", "batch_size=8"]]
    assert len(hydras) == 12
    expanded: list[object] = []
    monkeypatch.setattr(compose, "expand", lambda *a: expanded.append(a) or [])
    try:
        for combo in prechecked:
            checked.remember(combo, Checked(run_config(), {}))
        checked.remember_sweep(command)
        assert sweeper.combinations(arguments) == hydras and expanded == []  # the checked ones, not expanded again
        assert sweeper.combinations(["sweep=llm", "amp=O1", "batch_size=4,8"]) == [] and len(expanded) == 1
    finally:
        checked.forget_all()


@pytest.mark.slow
def test_a_real_sweep_in_rounds_ends_with_a_verdict_first(tmp_path):
    """Two combinations that differ by 4x the pixels, racing within a budget that plans two rounds: every run is
    in its round's folder with its round recorded; rounds.json says what was planned; the report opens with the
    verdict and every ok row has an interval from its runs."""
    sweep = tmp_path / "sweep"
    proc = run_sweep("strategy=single", "data.image_size=8,16", *[t for t in TINY if "image_size" not in t],
                     "iterations=40", "timing.budget_s=1", "repeat=null", "timing.busy_share=1", sweep_dir=sweep,
                     one_core=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {p.relative_to(sweep).as_posix(): json.loads(p.read_text()) for p in sweep.rglob("results.json")}
    assert sorted(results) == ["0_single_O0_data.image_size-8/results.json", "1_single_O0_data.image_size-16/results.json",
                               "round-2/0_single_O0_data.image_size-8/results.json",
                               "round-2/1_single_O0_data.image_size-16/results.json"]  # the swept setting named
    assert [results[k]["round"] for k in sorted(results)] == [1, 1, 2, 2]
    # each row once in each place; round 2 opens with round 1's last row, so it runs after itself
    assert [(results[k]["place"], results[k]["after"]) for k in sorted(results)] == [(1, None), (2, 0), (2, 1), (1, 1)]
    assert all(r["phases"]["windows"] > 0 and r["machine"]["cores"] for r in results.values())
    report = json.loads((sweep / "report.json").read_text())
    assert all(r["throughput_lo"] is not None for r in report["rows"])
    plan = json.loads((sweep / "rounds.json").read_text())
    assert (plan["planned"], plan["rounds_started"]) == (2, 2) and plan["orders"] == [[0, 1], [1, 0]]
    # 4x the pixels may be told apart at the last planned look (two paired rounds, one degree of freedom) or not:
    # both end the race after round 2, and a decision there is named as one.
    assert plan["ended_by"] in ("planned rounds", "decided: winner"), plan["ended_by"]
    assert plan["names"] == ["single data.image_size=8", "single data.image_size=16"]  # as the log names them
    out = proc.stdout + proc.stderr
    # the progress lines name the swept setting too (not "round 2 of ?: single, single")
    assert re.search(r"round 2 of \S+: single data\.image_size=(8|16), single data\.image_size=(16|8)\b", out), \
        out[-3000:]
    assert re.search(r"Verdict: .*px=8", out), out[-3000:]
    first_table_line = next(i for i, line in enumerate(out.splitlines()) if "combination" in line and "img/s" in line)
    verdict_line = next(i for i, line in enumerate(out.splitlines()) if "Verdict:" in line)
    assert verdict_line < first_table_line
