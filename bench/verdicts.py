"""How right the harness's verdicts are, the rule before issue 49 and now side by side on the same simulated data,
and the noise model checked against real sweeps on this machine.

    python bench/verdicts.py [--sweeps N] [--real-rounds N] [--only TEXT] [--write-results]

Simulated through the project's own code paths: harness.verdict.rounds.run_rounds (racing, or repeat=N) with
a fake launcher whose runs have known throughputs and a fake clock, then the report's own rows, fit, standing
and words (harness.report.rows, harness.report.decision). Throughput = truth x a per-round drift shared by
every row x lognormal run-to-run noise, and in the cells that say so: a place effect (the first or last run
of each round slower), outliers (a share of runs 30 % slow), a trend over the whole sweep. The rule before is
the harness's at commit OLD_COMMIT (rows as listed in odd rounds and reversed in even ones), loaded from git.

Each cell says what it asks:
(a) A/A: every row the same; any faster/slower word, early stop or winner is a false claim. Goal <= 5 %.
(b) power: a true 5 % at 7 % SD decided "faster" in >= 80 % of sweeps of the rounds the rule asks for
    (repeat=N); a true 10 % within the main job's default budget; the same with a place effect.
(c) a true difference of 1.5 x verdict.margin called "equivalent": <= 5 %; a word in the wrong direction: 0.
(d) 12 rows, the top two 8 % apart: the right winner at the rounds the rule asks for: >= 80 %.
(e) equal rows called equivalent (TOST's power; no goal: reported).
Real: identical work under two labels (`strategy=single dist.timeout_s=60,61`, a key the run never uses), in
--real-rounds paired rounds: each row's run-to-run SD, the drift between rounds, the paired ratios' SD, whether
per-round log ratios look independent and normal, and how often 95 % intervals over blocks of rounds cover 1;
then four such labels at the default budget and at repeat=20: the verdict's words and the place effect the
report estimates from the runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import multiprocessing
import random
import subprocess
import sys
import time
import types
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import common

from harness.core.results import SCHEMA, MachineLoad, RunRecord  # noqa: E402
from harness.report.decision import decide  # noqa: E402  (after common set sys.path)
from harness.report.findings import compute  # noqa: E402
from harness.report.rows import Row, apply_intervals, build_rows, find_results, row_fit  # noqa: E402
from harness.verdict.racing import standing  # noqa: E402
from harness.verdict.rounds import run_rounds  # noqa: E402
from harness.verdict.rule import Design, interval_text, rounds_needed  # noqa: E402
from harness.verdict.sweep_record import read_sweep_record  # noqa: E402

OLD_COMMIT = "63d49a2"  # the last commit before issue 49: rounds as listed, then reversed; Bonferroni; TOST at 1 - alpha
JOB_SECONDS = 6.0  # what one run costs the fake clock: this host's main job, a run's wall time (benchmark 9)
MAIN_JOB_BUDGET_S = 170.0  # conf/config.yaml's timing.budget_s on a CPU machine
DRIFT_SD = 0.03  # per-round drift shared by every row
OUTLIER_SLOW = 0.7  # an outlier run's throughput, as a share of its own
ALPHA = 0.05


@dataclass(frozen=True)
class Cell:
    name: str
    truths: tuple[float, ...]  # each row's true throughput (the first is the baseline row)
    sd: float  # run-to-run SD of log throughput
    repeat: int | None = None  # exactly N rounds; None: racing within budget_s
    budget_s: float = 1e9
    job_s: float = JOB_SECONDS  # what one run costs the fake clock
    first_slow: float = 0.0  # the first run of every round this much slower (0.05: 5 %)
    last_slow: float = 0.0  # the last run of every round this much slower
    outliers: float = 0.0  # this share of runs OUTLIER_SLOW x their throughput
    trend: float = 0.0  # the machine's speed changes by this share over the whole sweep (its budget or its rounds)

    @property
    def best(self) -> int:
        return max(range(len(self.truths)), key=lambda i: self.truths[i])

    @property
    def span_s(self) -> float:
        """The fake time the trend spreads over: the budget, or the rounds asked for."""
        return self.budget_s if self.repeat is None else self.repeat * len(self.truths) * self.job_s


@dataclass
class Outcome:
    claims_wrong: bool  # a faster/slower word, early stop or winner that the truth contradicts
    winner: int | None  # the row named fastest (decided winner), if any
    equivalent_claimed: bool  # the rows 0 and 1 called equivalent
    words: dict[tuple[int, int], str]  # (a, b): the word for a over b, every pair
    rounds: int


class FakeRuns:
    """The launcher: each job's throughput from the truth, the round's drift, its place in the round (a round's
    jobs come in one call, in the order they run), the sweep's trend, outliers and its own noise; the clock
    advances the cell's job_s a job."""

    def __init__(self, cell: Cell, rng: random.Random) -> None:
        self.cell, self.rng, self.now, self.drifts = cell, rng, 0.0, {}

    def clock(self) -> float:
        return self.now

    def launch(self, jobs: list[list[str]], first: int) -> list[dict[str, Any]]:
        out, cell = [], self.cell
        for place, job in enumerate(jobs, start=1):
            overrides = dict(o.partition("=")[::2] for o in job)
            index, number = int(overrides["combo"]), int(overrides["round"])
            drift = self.drifts.setdefault(number, self.rng.gauss(0, DRIFT_SD))
            effect = math.log(1 - cell.first_slow) if place == 1 else 0.0
            effect += math.log(1 - cell.last_slow) if place == len(jobs) and len(jobs) > 1 else 0.0
            effect += math.log1p(cell.trend) * min(1.0, self.now / cell.span_s)
            if cell.outliers and self.rng.random() < cell.outliers:
                effect += math.log(OUTLIER_SLOW)
            rate = cell.truths[index] * math.exp(drift + effect + self.rng.gauss(0, cell.sd))
            self.now += cell.job_s
            out.append({"status": "ok", "throughput_img_s": rate, "machine": {"busy": False}, "round": number,
                        "place": place})
        return out


def rows_of(runs: dict[int, list[tuple[int, float, int]]], k: int, repeat: int | None, margin: float) -> list[Row]:
    """The report's rows, as harness.report.rows builds them from results.json files, from the fake runs."""
    rows = []
    for i in range(k):
        mine = runs.get(i, [])
        row = Row(label=f"row{i}", strategy=f"s{i}", amp="O0", model="m", devices=["cpu"], processes=1,
                  global_batch=32, status="ok", reason=None, runs=len(mine), ok_runs=len(mine))
        row.run_throughputs = [(r, v) for r, v, _ in mine]
        row.run_s_per_20 = [(r, 1.0 / v) for r, v, _ in mine]
        row.run_places = {r: p for r, _, p in mine}
        row.run_rates = [v for _, v, _ in mine]
        row.config = {"repeat": repeat, "verdict": {"margin": margin}}
        rows.append(row)
    apply_intervals(rows)
    return rows


def simulate_new(cell: Cell, rng: random.Random, margin: float = 0.05) -> Outcome:
    fake = FakeRuns(cell, rng)
    k = len(cell.truths)
    combos = [[f"combo={i}"] for i in range(k)]
    runs: dict[int, list[tuple[int, float, int]]] = {}

    def launch(jobs: list[list[str]], first: int) -> list[RunRecord]:
        results = fake.launch(jobs, first)
        for job, result in zip(jobs, results, strict=True):
            runs.setdefault(int(job[0].partition("=")[2]), []).append(
                (result["round"], result["throughput_img_s"], result["place"]))
        return [RunRecord(schema=SCHEMA, status=r["status"], strategy="s", amp="O0", model="m", round=r["round"],
                          place=r["place"], throughput_img_s=r["throughput_img_s"],
                          machine=MachineLoad(busy=r["machine"]["busy"])) for r in results]

    outcome = run_rounds(combos, launch, cell.repeat, cell.budget_s, "${hydra.job.num}", lambda i: f"row{i}",
                         margin=margin, clock=fake.clock)
    rows = rows_of(runs, k, cell.repeat, margin)
    fit = row_fit(rows)
    state = standing(fit, [r.label for r in rows])
    words = {(a, b): fit.compare(f"row{a}", f"row{b}").word for a in range(k) for b in range(k) if a != b}
    winner = int(str(state.leader)[3:]) if state.decided == "winner" else None
    decide(rows)  # the sentence is made from the same figures (and must not fail on any of them)
    return Outcome(false_claim(cell, list(outcome.stopped), winner, words), winner,
                   words.get((0, 1)) == "equivalent", words, outcome.rounds)


def false_claim(cell: Cell, stopped: Sequence[int], winner: int | None, words: dict[tuple[int, int], str]) -> bool:
    """Any word the truth contradicts: a pair faster or slower the wrong way (or at all, between equals), a row
    stopped early that is among the fastest, a winner that is not the only fastest."""
    best = max(cell.truths)
    fastest = [i for i, t in enumerate(cell.truths) if t == best]
    if any(_contradicts(cell, a, b, w) for (a, b), w in words.items()):
        return True
    if any(c in fastest for c in stopped):
        return True
    return winner is not None and (winner not in fastest or len(fastest) > 1)


def _contradicts(cell: Cell, a: int, b: int, word: str) -> bool:
    """faster/slower against the truth (a tie in truth: any such word)."""
    truth_a, truth_b = cell.truths[a], cell.truths[b]
    if word == "faster":
        return truth_a <= truth_b
    if word == "slower":
        return truth_a >= truth_b
    return False


# ---- the rule before, as it was at OLD_COMMIT ----

STEMS = ("sequential", "rule", "intervals", "racing", "rounds")


def old_modules() -> types.SimpleNamespace:
    """harness/verdict/{sequential,rule,intervals,racing,rounds}.py at OLD_COMMIT, loaded from git under names
    of their own."""
    names = {stem: f"old_verdict_{stem}" for stem in STEMS}
    loaded = {}
    for stem in STEMS:
        source = subprocess.run(["git", "show", f"{OLD_COMMIT}:harness/verdict/{stem}.py"], cwd=common.REPO,
                                capture_output=True, text=True, check=True).stdout
        for other, renamed in names.items():
            source = source.replace(f"harness.verdict.{other}", renamed)
        spec = importlib.util.spec_from_loader(names[stem], loader=None)
        module = importlib.util.module_from_spec(spec)
        sys.modules[names[stem]] = module
        exec(compile(source, f"{OLD_COMMIT}:harness/verdict/{stem}.py", "exec"), module.__dict__)  # noqa: S102
        loaded[stem] = module
    return types.SimpleNamespace(**loaded)


def simulate_old(cell: Cell, rng: random.Random, old: types.SimpleNamespace, margin: float = 0.05) -> Outcome:
    """The same sweep through the rule before: its run_rounds (its order), and its fit judged as its report did
    (the family every pair of the rows, racing's looks by paired rounds, the last look's share at the end)."""
    fake = FakeRuns(cell, rng)
    k = len(cell.truths)
    combos = [[f"combo={i}"] for i in range(k)]
    found: list[Any] = []

    def launch(jobs: list[list[str]], first: int) -> list[RunRecord]:
        results = fake.launch(jobs, first)
        for job, result in zip(jobs, results, strict=True):
            found.append(old.intervals.Observation(f"row{job[0].partition('=')[2]}", result["round"],
                                                   result["throughput_img_s"]))
        return [RunRecord(schema=SCHEMA, status=r["status"], strategy="s", amp="O0", model="m", round=r["round"],
                          throughput_img_s=r["throughput_img_s"], machine=MachineLoad(busy=False)) for r in results]

    outcome = old.rounds.run_rounds(combos, launch, cell.repeat, cell.budget_s, "${hydra.job.num}",
                                    lambda i: f"row{i}", margin=margin, clock=fake.clock)
    design = old.rule.Design(pairs=old.rule.Design.family(k), margin=margin) if cell.repeat else \
        old.rule.Design(pairs=old.rule.Design.family(k), planned_rounds=outcome.planned, margin=margin,
                        last_look=outcome.rounds)
    fit = old.intervals.Fit(found, design)
    state = old.racing.standing(fit, [f"row{i}" for i in range(k)])
    words = {(a, b): fit.compare(f"row{a}", f"row{b}").word for a in range(k) for b in range(k) if a != b}
    winner = int(str(state.leader)[3:]) if state.decided == "winner" else None
    return Outcome(false_claim(cell, list(outcome.stopped), winner, words), winner,
                   words.get((0, 1)) == "equivalent", words, outcome.rounds)


_OLD: types.SimpleNamespace | None = None


def run_cell(job: tuple[Cell, int, int, str]) -> list[Outcome]:
    """`sweeps` sweeps of one cell through one rule ("new" or "old"), from the cell's own seed."""
    cell, sweeps, seed, rule = job
    global _OLD
    if rule == "old" and _OLD is None:
        _OLD = old_modules()
    rng = random.Random(seed)
    if rule == "old":
        return [simulate_old(cell, rng, _OLD) for _ in range(sweeps)]
    return [simulate_new(cell, rng) for _ in range(sweeps)]


def rule_rounds(effect: float, sd: float, rows: int) -> int:
    """The rounds the rule asks for (`repeat=N`) to decide `effect` at run-to-run `sd` among `rows` rows:
    the paired SD of one pair is sd x sqrt(2) (the drift cancels)."""
    needed = rounds_needed(math.log(effect), sd * math.sqrt(2), Design(pairs=Design.family(rows)))
    assert needed is not None
    return needed


def cells(quick: bool, measured: Measured | None = None) -> list[tuple[str, Cell, str]]:
    """(case, cell, what counts): the simulated cases (with `measured`, one more: a 10 % difference at the SD and
    run time measured on this machine, in the main job's budget)."""
    out: list[tuple[str, Cell, str]] = []
    budget = MAIN_JOB_BUDGET_S
    for rows in (2, 3, 4, 12):
        for sd in (0.03, 0.07, 0.15):
            out.append((f"(a) A/A, {rows} rows, SD {sd:.0%}, racing {budget:.0f} s",
                        Cell("aa", (100.0,) * rows, sd, None, budget), "claims"))
    out.append(("(a) A/A, 12 rows, SD 7%, racing 1200 s", Cell("aa", (100.0,) * 12, 0.07, None, 1200.0), "claims"))
    out.append(("(a) A/A, 4 rows, SD 7%, repeat=30", Cell("aa", (100.0,) * 4, 0.07, 30), "claims"))
    for rows, sd in ((2, 0.03), (3, 0.03), (3, 0.07), (4, 0.03), (4, 0.07), (12, 0.03)):
        out.append((f"(a) A/A, first run 5 % slower, {rows} rows, SD {sd:.0%}, racing {budget:.0f} s",
                    Cell("aa", (100.0,) * rows, sd, None, budget, first_slow=0.05), "claims"))
    out.append(("(a) A/A, first run 5 % slower, 4 rows, SD 7%, repeat=30",
                Cell("aa", (100.0,) * 4, 0.07, 30, first_slow=0.05), "claims"))
    out.append(("(a) A/A, first run 5 % slower, 12 rows, SD 3%, repeat=10",
                Cell("aa", (100.0,) * 12, 0.03, 10, first_slow=0.05), "claims"))
    for rows in (3, 4):
        out.append((f"(a) A/A, last run 5 % slower, {rows} rows, SD 3%, racing {budget:.0f} s",
                    Cell("aa", (100.0,) * rows, 0.03, None, budget, last_slow=0.05), "claims"))
    out.append((f"(a) A/A, 5 % of runs 30 % slow, 4 rows, SD 7%, racing {budget:.0f} s",
                Cell("aa", (100.0,) * 4, 0.07, None, budget, outliers=0.05), "claims"))
    out.append(("(a) A/A, +10 % drift over the sweep, 4 rows, SD 7%, racing 1200 s",
                Cell("aa", (100.0,) * 4, 0.07, None, 1200.0, trend=0.10), "claims"))
    out.append(("(a) A/A, +10 % drift over the sweep, 12 rows, SD 3%, repeat=10",
                Cell("aa", (100.0,) * 12, 0.03, 10, trend=0.10), "claims"))
    n5 = rule_rounds(1.05, 0.07, 2)
    out.append((f"(b) 1.05 at SD 7 %, 2 rows, repeat={n5} (the rule's rounds)", Cell("b5", (105.0, 100.0), 0.07, n5),
                "faster"))
    out.append((f"(b) 1.05 at SD 7 %, 2 rows, first run 5 % slower, repeat={n5}",
                Cell("b5", (105.0, 100.0), 0.07, n5, first_slow=0.05), "faster"))
    n5_4 = rule_rounds(1.05, 0.07, 4)
    out.append((f"(b) 1.05 at SD 7 %, 4 rows (the others 10 % slower), first run 5 % slower, repeat={n5_4}",
                Cell("b5", (105.0, 100.0, 90.0, 90.0), 0.07, n5_4, first_slow=0.05), "faster"))
    out.append((f"(b) 1.10 at SD 7 %, 2 rows, racing {budget:.0f} s",
                Cell("b10", (110.0, 100.0), 0.07, None, budget), "faster"))
    if measured is not None:
        out.append((f"(b) 1.10 at this host's SD ({measured.sd:.1%}, measured), racing {budget:.0f} s, "
                    f"{measured.run_s:.1f} s a run", Cell("b10h", (110.0, 100.0), measured.sd, None, budget,
                                                        measured.run_s), "faster"))
    for sd in (0.03, 0.07, 0.15):
        out.append((f"(c) 1.075 (1.5 x margin) at SD {sd:.0%}, racing 1200 s",
                    Cell("c", (107.5, 100.0), sd, None, 1200.0), "equivalent"))
    top = (108.0, 100.0, 90.0, 88.0, 86.0, 84.0, 82.0, 80.0, 78.0, 76.0, 74.0, 72.0)
    n8 = rule_rounds(1.08, 0.07, 12)
    out.append((f"(d) 12 rows, top two 8 % apart, SD 7 %, repeat={n8} (the rule's rounds)",
                Cell("d", top, 0.07, n8), "winner"))
    for sd in (0.03, 0.07):
        out.append((f"(e) A/A, 2 rows, SD {sd:.0%}, racing 1200 s: called equivalent",
                    Cell("e", (100.0, 100.0), sd, None, 1200.0), "equivalent_power"))
    return out


def measure(outcomes: Sequence[Outcome], what: str, cell: Cell) -> float:
    if what == "claims":
        return sum(o.claims_wrong for o in outcomes) / len(outcomes)
    if what == "faster":
        return sum(o.words.get((0, 1)) == "faster" for o in outcomes) / len(outcomes)
    if what in ("equivalent", "equivalent_power"):
        return sum(o.equivalent_claimed for o in outcomes) / len(outcomes)
    return sum(o.winner == cell.best for o in outcomes) / len(outcomes)


GOALS = {"claims": ("≤ 5 %", lambda v: v <= 0.05), "faster": ("≥ 80 %", lambda v: v >= 0.80),
         "equivalent": ("≤ 5 %", lambda v: v <= 0.05), "winner": ("≥ 80 %", lambda v: v >= 0.80),
         "equivalent_power": ("reported", lambda v: True)}
WHAT = {"claims": "a false claim", "faster": "decided faster", "equivalent": "called equivalent",
        "winner": "the right winner", "equivalent_power": "called equivalent"}


def binomial_ok(value: float, sweeps: int, goal: float = 0.05) -> bool:
    """Within the binomial noise of the goal: the one-sided 97.5 % bound of `sweeps` draws at `goal`."""
    return value <= goal + 1.96 * math.sqrt(goal * (1 - goal) / sweeps)


def wrong_direction(outcomes: Sequence[Outcome], cell: Cell) -> int:
    return sum(any(_contradicts(cell, a, b, w) for (a, b), w in o.words.items()) for o in outcomes)


# ---- the family's level: Bonferroni, a max-t critical value, comparisons with the best ----

def family_levels(samples: int, seed: int = 0) -> common.Table:
    """A/A sweeps of k rows and n paired rounds (equal spreads, numpy): the critical |t| that keeps the chance of
    any pair's interval excluding 1 at 5 % (max-t, simulated), against Bonferroni's over all k(k-1)/2 pairs, and
    how often comparisons with the best at 5 % / (k - 1) call some pair of equal rows different."""
    import itertools

    import numpy as np
    from scipy import stats

    rng = np.random.default_rng(seed)
    table = common.Table("the family's level: Bonferroni over all pairs, a simulated max-t, comparisons with the best "
                         f"(A/A, {samples} simulated sweeps a cell)",
                         ["rows", "rounds", "pairs", "Bonferroni |t|", "max-t |t|", "max-t width / Bonferroni",
                          "A/A claims, Bonferroni", "A/A claims, with the best (alpha / (k-1))"])
    for k in (3, 4, 12):
        for n in (5, 10, 30):
            y = rng.standard_normal((samples, k, n))
            largest = np.zeros(samples)
            for a, b in itertools.combinations(range(k), 2):
                d = y[:, a, :] - y[:, b, :]
                largest = np.maximum(largest, np.abs(d.mean(1)) / (d.std(1, ddof=1) / math.sqrt(n)))
            pairs = k * (k - 1) // 2
            bonferroni = float(stats.t.isf(ALPHA / pairs / 2, n - 1))
            max_t = float(np.quantile(largest, 1 - ALPHA))
            best = float(stats.t.isf(ALPHA / (k - 1) / 2, n - 1))
            table.add(k, n, pairs, f"{bonferroni:.2f}", f"{max_t:.2f}", f"{max_t / bonferroni:.3f}",
                      f"{100 * float(np.mean(largest > bonferroni)):.1f} %", f"{100 * float(np.mean(largest > best)):.1f} %")
    return table


# ---- real sweeps: the noise model, and four identical rows ----

@dataclass(frozen=True)
class Measured:
    lines: list[str]
    sd: float  # run-to-run SD of log throughput, the two rows' pooled (drift included, as the simulation's)
    run_s: float  # a run's wall time, median


def real_noise(rounds: int, runs: common.Path) -> Measured:
    """Identical work under two labels, `rounds` paired rounds: what the noise model assumes, checked."""
    from scipy import stats

    folder = common.sweep(["strategy=single", "amp=O0", "dist.timeout_s=60,61", f"repeat={rounds}",
                           "timing.busy_share=1"], runs / "identical")
    found, _ = find_results([folder])
    walls = sorted(r.finished_at - r.started_at for _, r in found if r.finished_at and r.started_at)
    rows, _ = build_rows(found)
    logs = {r.label: dict(r.run_throughputs) for r in rows if r.run_throughputs}
    (a, ya), (b, yb) = sorted(logs.items())
    common_rounds = sorted(set(ya) & set(yb))
    la = [math.log(ya[n]) for n in common_rounds]
    lb = [math.log(yb[n]) for n in common_rounds]
    d = [x - y for x, y in zip(la, lb, strict=True)]
    sd = statistics_sd
    lag = float(stats.pearsonr(d[:-1], d[1:])[0]) if len(d) > 3 else float("nan")
    normal = float(stats.shapiro(d).pvalue) if len(d) >= 3 else float("nan")
    block = 3
    blocks = [d[i:i + block] for i in range(0, len(d) - block + 1, block)]
    covers = [abs(sum(x) / block) <= stats.t.ppf(0.975, block - 1) * sd(x) / math.sqrt(block) for x in blocks]
    fit = row_fit(rows)
    judged = fit.compare(a, b)
    places = ", ".join(f"place {p.place}: {p.ratio:.3f}×{interval_text(p.lo, p.hi, 3)}" for p in fit.place_effects())
    shared = statistics_cov(la, lb)  # the drift both rows of a round share
    own = sd(d) / math.sqrt(2)  # each run's own noise, once the round's drift is paired out
    return Measured([f"{len(common_rounds)} paired rounds of identical work ({a} vs {b}): each row's runs spread "
                     f"{100 * sd(la):.1f} % and {100 * sd(lb):.1f} % (SD of log throughput); the per-round log ratio "
                     f"{100 * sd(d):.1f} %, i.e. {100 * own:.1f} % of noise of its own in each run, and a drift shared "
                     f"by the round of {100 * math.sqrt(max(shared, 0.0)):.1f} % (the simulation's cells: 3 / 7 / 15 % "
                     f"and {100 * DRIFT_SD:.0f} %)",
                     f"per-round log ratios: lag-1 autocorrelation {lag:+.2f} (independent rounds: about 0), "
                     f"Shapiro-Wilk p = {normal:.2f} (normal: not small); 95 % t-intervals over {len(blocks)} blocks "
                     f"of {block} rounds covered 1 in {sum(covers)} ({100 * sum(covers) / max(1, len(blocks)):.0f} %)",
                     f"the report's word on the pair: {judged.word} at {judged.ratio:.3f}×"
                     f"{interval_text(judged.lo, judged.hi, 3)}; each place's effect against the round's average "
                     f"(95 %, Bonferroni over places): {places or 'not estimable'}; a run took "
                     f"{walls[len(walls) // 2]:.1f} s (median)"],
                    own, walls[len(walls) // 2])


def real_four(runs: common.Path, repeat: int | None) -> list[str]:
    """Four identical rows (labels differing only): what the verdict said, whether each row took each place,
    and the place effect the report estimates."""
    timeouts = "dist.timeout_s=60,61,62,63"
    how = f"repeat={repeat}" if repeat else "repeat=null"
    folder = common.sweep(["strategy=single", "amp=O0", timeouts, how, "timing.busy_share=1"],
                          runs / f"four-{repeat or 'racing'}")
    report = compute([folder])  # as `python -m harness.report FOLDER` makes it
    found, _ = find_results([folder])
    plan = read_sweep_record([folder])
    decision = report.decision
    fit = row_fit(report.rows, planned=plan.planned if plan else None)
    places: dict[str, list[int]] = {}
    for _, r in found:
        places.setdefault(str(r.config.get("dist", {}).get("timeout_s")), []).append(r.place or 0)
    per_row = "; ".join(f"timeout_s={k}: places {sorted(v)}" for k, v in sorted(places.items()))
    effects = ", ".join(f"place {p.place}: {p.ratio:.3f}×{interval_text(p.lo, p.hi, 3)}" for p in fit.place_effects())
    rounds = plan.rounds_started if plan else "?"
    return [f"four identical rows, {how} ({rounds} rounds, {sum(1 for _ in found)} runs): the verdict said: "
            f"\"{decision.verdict}\"",
            f"four identical rows, {how}: each row's places: {per_row}; each place's effect against the round's "
            f"average (95 %, Bonferroni over places): {effects or 'not estimable'}"]


def statistics_cov(x: Sequence[float], y: Sequence[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / (len(x) - 1)


def statistics_sd(values: Sequence[float]) -> float:
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweeps", type=int, default=1000, help="simulated sweeps per case and rule (default 1000)")
    parser.add_argument("--real-rounds", type=int, default=30, help="paired rounds of the real check (default 30)")
    parser.add_argument("--only", default="", help="simulate only the cases whose name holds this text")
    parser.add_argument("--no-real", action="store_true", help="no real sweep (simulations only)")
    args = common.parse_args(parser, argv)
    if args.quick:  # seconds: a few simulated sweeps of each case, no real sweep
        args.sweeps, args.real_rounds = 5, 0
    if args.no_real:
        args.real_rounds = 0
    settings = {"sweeps per case and rule": args.sweeps, "drift SD per round": f"{DRIFT_SD:.0%}",
                "a run on the fake clock": f"{JOB_SECONDS:g} s", "rule before": f"harness at {OLD_COMMIT}",
                "real check": f"{args.real_rounds} paired rounds, four rows racing and at repeat=20"
                if args.real_rounds else "none",
                "cores": common.cores(), "OMP_NUM_THREADS": "pinned to the cores (common.pinned_env)"}
    common.print_settings("The verdicts against sweeps whose truth is known", settings)
    measured: Measured | None = None
    real_lines: list[str] = []
    if args.real_rounds:
        with common.runs_dir(args, "verdicts") as runs, common.measure_load() as load:
            measured = real_noise(args.real_rounds, runs)
            real_lines += real_four(runs, None) + real_four(runs, 20)
        real_lines += [f"background load during the real sweeps: {load.background:.2f} cores"]
    table = common.Table("verdicts against known truths, simulated (the rule before | now, same data)",
                         ["case", "measure", "goal", "before", "now", "now: rounds (mean)", "now met"])
    started = time.perf_counter()
    notes = []
    chosen = [c for c in cells(args.quick, measured) if args.only in c[0]]
    jobs = [(cell, args.sweeps, zlib.crc32(case.encode()), rule) for case, cell, _ in chosen for rule in ("new", "old")]
    workers = min(common.cores(), len(jobs)) if args.sweeps >= 50 else 1
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(run_cell, jobs, chunksize=1)
    else:
        results = [run_cell(job) for job in jobs]
    for index, (case, cell, what) in enumerate(chosen):
        new, was = results[2 * index], results[2 * index + 1]
        goal, met = GOALS[what]
        value_new, value_old = measure(new, what, cell), measure(was, what, cell)
        verdict = "yes" if met(value_new) else ("within binomial noise" if what == "claims" and
                                                 binomial_ok(value_new, len(new)) else "NO")
        table.add(case, WHAT[what], goal, f"{100 * value_old:.1f} %", f"{100 * value_new:.1f} %",
                  f"{sum(o.rounds for o in new) / len(new):.1f}", verdict if goal != "reported" else "-")
        if what in ("equivalent", "faster"):
            notes.append(f"{case}: a word in the wrong direction in {wrong_direction(new, cell)} of {len(new)} "
                         f"sweeps (before: {wrong_direction(was, cell)})")
        print(f"  {case}: before {100 * value_old:.1f} %, now {100 * value_new:.1f} %", flush=True)
    table.print()
    levels = family_levels(2000 if args.quick else 40000)
    levels.print()
    real: list[str] = []
    if measured is not None:
        real = [*measured.lines, *real_lines]
    took = time.perf_counter() - started
    for line in notes + real:
        print(line, flush=True)
    print(f"took {took:.0f} s", flush=True)
    if args.write_results:
        lines = [f"- {args.sweeps} simulated sweeps per case and rule, the same seeds for both; the simulations took "
                 f"{took / 60:.0f} min on {workers} processes.",
                 "- A false claim: any pair worded faster or slower against the truth, any early stop of a row that "
                 "is not slower, any winner that is not the fastest (docs/verdict.md). 'within binomial noise': at "
                 "most 5 % + 1.96 binomial SDs of the sweeps run (6.4 % at 1,000).",
                 *[f"- {line}" for line in notes], *[f"- Real: {line}" for line in real]]
        common.write_results("verdicts", common.results_page("verdicts", settings, [table, levels], lines), args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
