"""How right the harness's verdicts are, old rule and new rule side by side on the same simulated data, and the
noise model checked against real sweeps on this machine.

    python bench/verdicts.py [--sweeps N] [--real-rounds N] [--write-results]

Simulated through the project's own code paths: harness.verdict.rounds.run_rounds (racing, or repeat=N) with
a fake launcher whose runs have known throughputs and a fake clock, then the report's own rows, fit, standing
and words (harness.report.rows, harness.report.decision). Throughput = truth x a per-round drift shared by
every row x lognormal run-to-run noise. The old rule is the harness's at commit OLD_COMMIT, loaded from git.

(a) A/A: every row the same; any faster/slower word, early stop or winner is a false claim. Goal <= 5 %.
(b) power: a true 5 % difference at 7 % SD decided "faster" in >= 80 % of sweeps of the rounds the rule asks
    for (repeat=N, N from the rule's own estimate); a true 10 % within the main job's default budget.
(c) a true difference of 1.5 x verdict.margin called "equivalent": <= 5 %; a word in the wrong direction: 0.
(d) 12 rows, the top two 8 % apart: the right winner at the rounds the rule asks for: >= 80 %.
Real: identical work under two labels (`strategy=single dist.timeout_s=60,61`, a key the run never uses), in
--real-rounds paired rounds: each row's run-to-run SD, the drift between rounds, the paired ratios' SD, whether
per-round log ratios look independent and normal, and how often 95 % intervals over blocks of rounds cover 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random
import subprocess
import sys
import time
import types
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import common

from harness.core.results import SCHEMA, MachineLoad, RunRecord  # noqa: E402
from harness.report.decision import decide  # noqa: E402  (after common set sys.path)
from harness.report.rows import Row, apply_intervals, build_rows, find_results, row_fit  # noqa: E402
from harness.verdict.racing import standing  # noqa: E402
from harness.verdict.rounds import run_rounds  # noqa: E402
from harness.verdict.rule import Design, interval_text, rounds_needed  # noqa: E402

OLD_COMMIT = "ca016b6"  # the last commit with the old rule (minimum effect, unpaired pooled SD, racing at 95 %)
JOB_SECONDS = 6.0  # what one run costs the fake clock: this host's main job, a run's wall time (benchmark 9)
MAIN_JOB_BUDGET_S = 170.0  # conf/config.yaml's timing.budget_s on a CPU machine
DRIFT_SD = 0.03  # per-round drift shared by every row


@dataclass(frozen=True)
class Cell:
    name: str
    truths: tuple[float, ...]  # each row's true throughput (the first is the baseline row)
    sd: float  # run-to-run SD of log throughput
    repeat: int | None = None  # exactly N rounds; None: racing within budget_s
    budget_s: float = 1e9
    job_s: float = JOB_SECONDS  # what one run costs the fake clock

    @property
    def best(self) -> int:
        return max(range(len(self.truths)), key=lambda i: self.truths[i])


@dataclass
class Outcome:
    claims_wrong: bool  # a faster/slower word, early stop or winner that the truth contradicts
    winner: int | None  # the row named fastest (decided winner), if any
    equivalent_claimed: bool  # the rows 0 and 1 called equivalent
    words: dict[tuple[int, int], str]  # (a, b): the word for a over b, every pair
    rounds: int


class FakeRuns:
    """The launcher: each job's throughput from the truth, the round's drift and its own noise; the clock
    advances JOB_SECONDS a job."""

    def __init__(self, cell: Cell, rng: random.Random) -> None:
        self.cell, self.rng, self.now, self.drifts = cell, rng, 0.0, {}

    def clock(self) -> float:
        return self.now

    def launch(self, jobs: list[list[str]], first: int) -> list[dict[str, Any]]:
        out = []
        for job in jobs:
            index = int(dict(o.partition("=")[::2] for o in job)["combo"])
            number = int(dict(o.partition("=")[::2] for o in job)["round"])
            drift = self.drifts.setdefault(number, self.rng.gauss(0, DRIFT_SD))
            rate = self.cell.truths[index] * math.exp(drift + self.rng.gauss(0, self.cell.sd))
            self.now += self.cell.job_s
            out.append({"status": "ok", "throughput_img_s": rate, "machine": {"busy": False}, "round": number})
        return out


def rows_of(runs: dict[int, list[tuple[int, float]]], k: int, repeat: int | None, margin: float) -> list[Row]:
    """The report's rows, as harness.report.rows builds them from results.json files, from the fake runs."""
    rows = []
    for i in range(k):
        mine = runs.get(i, [])
        row = Row(label=f"row{i}", strategy=f"s{i}", amp="O0", model="m", devices=["cpu"], processes=1,
                  global_batch=32, status="ok", reason=None, runs=len(mine), ok_runs=len(mine))
        row.run_throughputs = list(mine)
        row.run_s_per_20 = [(r, 1.0 / v) for r, v in mine]
        row.run_rates = [v for _, v in mine]
        row.config = {"repeat": repeat, "verdict": {"margin": margin}}
        rows.append(row)
    apply_intervals(rows)
    return rows


def simulate_new(cell: Cell, rng: random.Random, margin: float = 0.05) -> Outcome:
    fake = FakeRuns(cell, rng)
    k = len(cell.truths)
    combos = [[f"combo={i}"] for i in range(k)]
    runs: dict[int, list[tuple[int, float]]] = {}

    def launch(jobs: list[list[str]], first: int) -> list[RunRecord]:
        results = fake.launch(jobs, first)
        for job, result in zip(jobs, results, strict=True):
            runs.setdefault(int(job[0].partition("=")[2]), []).append((result["round"], result["throughput_img_s"]))
        return [RunRecord(schema=SCHEMA, status=r["status"], strategy="s", amp="O0", model="m", round=r["round"],
                          throughput_img_s=r["throughput_img_s"], machine=MachineLoad(busy=r["machine"]["busy"]))
                for r in results]  # as the jobs return them (the old rule at OLD_COMMIT read these dicts)

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


# ---- the old rule, as it was at OLD_COMMIT ----

def old_modules() -> types.SimpleNamespace:
    """harness/verdict/{intervals,racing,rounds}.py at OLD_COMMIT, loaded from git under names of their own."""
    names = {"intervals": "old_verdict_intervals", "racing": "old_verdict_racing", "rounds": "old_verdict_rounds"}
    loaded = {}
    for stem in ("intervals", "racing", "rounds"):
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


def simulate_old(cell: Cell, rng: random.Random, old: types.SimpleNamespace) -> Outcome:
    fake = FakeRuns(cell, rng)
    k = len(cell.truths)
    combos = [[f"combo={i}"] for i in range(k)]
    found: list[Any] = []

    def launch(jobs: list[list[str]], first: int) -> list[dict[str, Any]]:
        results = fake.launch(jobs, first)
        for job, result in zip(jobs, results, strict=True):
            found.append(old.intervals.Observation(f"row{job[0].partition('=')[2]}", result["round"],
                                                   result["throughput_img_s"]))
        return results

    outcome = old.rounds.run_rounds(combos, launch, cell.repeat, cell.budget_s, "${hydra.job.num}",
                                    lambda i: f"row{i}", clock=fake.clock)
    fit = old.intervals.Fit(found)
    state = old.racing.standing(fit, [f"row{i}" for i in range(k)])
    old_word = {"same": "equivalent"}
    words = {(a, b): old_word.get(w, w) for a in range(k) for b in range(k) if a != b
             for w in [fit.judge(fit.ratio(f"row{a}", f"row{b}"))]}
    winner = int(str(state.leader)[3:]) if state.decided == "winner" else None
    return Outcome(false_claim(cell, list(outcome.stopped), winner, words), winner,
                   words.get((0, 1)) == "equivalent", words, outcome.rounds)


def run_cell(cell: Cell, sweeps: int, seed: int, simulate: Callable[[Cell, random.Random], Outcome],
             ) -> list[Outcome]:
    rng = random.Random(seed)
    return [simulate(cell, rng) for _ in range(sweeps)]


def rule_rounds(effect: float, sd: float, rows: int) -> int:
    """The rounds the rule asks for (`repeat=N`) to decide `effect` at run-to-run `sd` among `rows` rows:
    the paired SD of one pair is sd x sqrt(2) (the drift cancels)."""
    needed = rounds_needed(math.log(effect), sd * math.sqrt(2), Design(pairs=Design.family(rows)))
    assert needed is not None
    return needed


def cells(quick: bool, measured: Measured | None = None) -> list[tuple[str, Cell, str]]:
    """(case, cell, what counts): the simulated cases of the issue's table (with `measured`, one more: a 10 %
    difference at the SD and run time measured on this machine, in the main job's budget)."""
    out: list[tuple[str, Cell, str]] = []
    for rows in (2, 12):
        for sd in (0.02, 0.07, 0.15):
            for budget in ((MAIN_JOB_BUDGET_S, 1200.0) if not quick else (MAIN_JOB_BUDGET_S,)):
                out.append((f"(a) A/A, {rows} rows, SD {sd:.0%}, racing, budget {budget:.0f} s",
                            Cell("aa", (100.0,) * rows, sd, None, budget), "claims"))
    n5 = rule_rounds(1.05, 0.07, 2)
    out.append((f"(b) 1.05 at SD 7 %, repeat={n5} (the rule's rounds)", Cell("b5", (105.0, 100.0), 0.07, n5), "faster"))
    out.append(("(b) 1.10 at SD 7 %, racing in the main job's budget (170 s)",
                Cell("b10", (110.0, 100.0), 0.07, None, MAIN_JOB_BUDGET_S), "faster"))
    if measured is not None:
        out.append((f"(b) 1.10 at this host's SD ({measured.sd:.1%}, measured), racing in 170 s, "
                    f"{measured.run_s:.1f} s a run", Cell("b10h", (110.0, 100.0), measured.sd, None, MAIN_JOB_BUDGET_S,
                                                        measured.run_s), "faster"))
    for sd in (0.02, 0.07, 0.15):
        out.append((f"(c) 1.075 (1.5 x margin) at SD {sd:.0%}, racing, budget 1200 s",
                    Cell("c", (107.5, 100.0), sd, None, 1200.0), "equivalent"))
    top = (108.0, 100.0, 90.0, 88.0, 86.0, 84.0, 82.0, 80.0, 78.0, 76.0, 74.0, 72.0)
    n8 = rule_rounds(1.08, 0.07, 12)
    out.append((f"(d) 12 rows, top two 8 % apart, SD 7 %, repeat={n8} (the rule's rounds)",
                Cell("d", top, 0.07, n8), "winner"))
    return out


def measure(outcomes: Sequence[Outcome], what: str, cell: Cell) -> float:
    if what == "claims":
        return sum(o.claims_wrong for o in outcomes) / len(outcomes)
    if what == "faster":
        return sum(o.words.get((0, 1)) == "faster" for o in outcomes) / len(outcomes)
    if what == "equivalent":
        return sum(o.equivalent_claimed for o in outcomes) / len(outcomes)
    return sum(o.winner == cell.best for o in outcomes) / len(outcomes)


GOALS = {"claims": ("≤ 5 %", lambda v: v <= 0.05), "faster": ("≥ 80 %", lambda v: v >= 0.80),
         "equivalent": ("≤ 5 %", lambda v: v <= 0.05), "winner": ("≥ 80 %", lambda v: v >= 0.80)}
WHAT = {"claims": "a false claim", "faster": "decided faster", "equivalent": "called equivalent",
        "winner": "the right winner"}


def wrong_direction(outcomes: Sequence[Outcome], cell: Cell) -> int:
    return sum(any(_contradicts(cell, a, b, w) for (a, b), w in o.words.items()) for o in outcomes)


# ---- real sweeps: the noise model ----

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
    shared = statistics_cov(la, lb)  # the drift both rows of a round share
    own = sd(d) / math.sqrt(2)  # each run's own noise, once the round's drift is paired out
    return Measured([f"{len(common_rounds)} paired rounds of identical work ({a} vs {b}): each row's runs spread "
                     f"{100 * sd(la):.1f} % and {100 * sd(lb):.1f} % (SD of log throughput); the per-round log ratio "
                     f"{100 * sd(d):.1f} %, i.e. {100 * own:.1f} % of noise of its own in each run, and a drift shared "
                     f"by the round of {100 * math.sqrt(max(shared, 0.0)):.1f} % (the simulation's cells: 2 / 7 / 15 % "
                     f"and {100 * DRIFT_SD:.0f} %)",
                     f"per-round log ratios: lag-1 autocorrelation {lag:+.2f} (independent rounds: about 0), "
                     f"Shapiro-Wilk p = {normal:.2f} (normal: not small); 95 % t-intervals over {len(blocks)} blocks "
                     f"of {block} rounds covered 1 in {sum(covers)} ({100 * sum(covers) / max(1, len(blocks)):.0f} %)",
                     f"the report's word on the pair: {judged.word} at {judged.ratio:.3f}×"
                     f"{interval_text(judged.lo, judged.hi, 3)}; a run took {walls[len(walls) // 2]:.1f} s (median)"],
                    own, walls[len(walls) // 2])


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
    args = common.parse_args(parser, argv)
    if args.quick:  # seconds: a few simulated sweeps of each case, no real sweep
        args.sweeps, args.real_rounds = 5, 0
    settings = {"sweeps per case and rule": args.sweeps, "drift SD per round": f"{DRIFT_SD:.0%}",
                "a run on the fake clock": f"{JOB_SECONDS:g} s", "old rule": f"harness at {OLD_COMMIT}",
                "real check": f"{args.real_rounds} paired rounds" if args.real_rounds else "none",
                "cores": common.cores(), "OMP_NUM_THREADS": "pinned to the cores (common.pinned_env)"}
    common.print_settings("The verdicts against sweeps whose truth is known", settings)
    measured: Measured | None = None
    real_load = None
    if args.real_rounds:
        with common.runs_dir(args, "verdicts") as runs, common.measure_load() as load:
            measured = real_noise(args.real_rounds, runs)
        real_load = load.background
    old = old_modules()
    table = common.Table("verdicts against known truths, simulated (old rule | new rule, same data)",
                         ["case", "measure", "goal", "old", "new", "new: rounds (mean)", "new met"])
    started = time.perf_counter()
    notes = []
    for case, cell, what in cells(args.quick, measured):
        seed = zlib.crc32(case.encode())  # the same seeds in every invocation (str hashes are salted)
        new = run_cell(cell, args.sweeps, seed, simulate_new)
        was = run_cell(cell, args.sweeps, seed, lambda c, r: simulate_old(c, r, old))
        goal, met = GOALS[what]
        value_new, value_old = measure(new, what, cell), measure(was, what, cell)
        table.add(case, WHAT[what], goal, f"{100 * value_old:.1f} %", f"{100 * value_new:.1f} %",
                  f"{sum(o.rounds for o in new) / len(new):.1f}", "yes" if met(value_new) else "NO")
        if what in ("equivalent", "faster"):
            notes.append(f"{case}: a word in the wrong direction in {wrong_direction(new, cell)} of {len(new)} "
                         f"sweeps (old rule: {wrong_direction(was, cell)})")
        print(f"  {case}: old {100 * value_old:.1f} %, new {100 * value_new:.1f} %", flush=True)
    table.print()
    real: list[str] = []
    if measured is not None:
        real = [*measured.lines, f"background load during the real sweep: {real_load:.2f} cores"]
    took = time.perf_counter() - started
    for line in notes + real:
        print(line, flush=True)
    print(f"took {took:.0f} s", flush=True)
    if args.write_results:
        lines = [f"- {args.sweeps} simulated sweeps per case and rule, the same seeds for both; took {took / 60:.0f} min.",
                 "- A false claim: any pair worded faster or slower against the truth, any early stop of a row that "
                 "is not slower, any winner that is not the fastest (docs/verdict.md).",
                 *[f"- {line}" for line in notes], *[f"- Real: {line}" for line in real]]
        common.write_results("verdicts", common.results_page("verdicts", settings, [table], lines), args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
