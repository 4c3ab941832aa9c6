"""What the report concludes, decided once for every output (terminal, report.md, report.json, index.html):
the verdict sentence, how the figures were made, and which figures win. Every word follows harness.verdict's
one rule; the sentence names the figures the rule used, and when it cannot decide, how many rounds would
(and the command that runs them), or that no practical number would."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.parity import report as parity
from harness.report.rows import Row, judged, row_fit, work_per_sample
from harness.verdict.intervals import Fit
from harness.verdict.racing import Standing, standing
from harness.verdict.rule import MAX_ROUNDS_ADVISED, Judgement, interval_text
from harness.verdict.sequential import FINAL_SHARE
from harness.verdict.sweep_record import SweepRecord

WIN_WORDS = {"throughput": "fastest", "s_per_20": "least time per 20 iterations", "mem_max_mib": "least memory"}
SLOWER_NAMED = 3  # the verdict names the closest of the slower rows; the speed table has them all


@dataclass(frozen=True)
class Decision:
    verdict: str
    reproducibility: str
    winners: dict[str, str] = field(default_factory=dict)
    standing: Standing | None = None  # the rule's standing of the rows, which the words above say
    margin: float | None = None  # verdict.margin, as the rows' fit judged them


def decide(rows: Sequence[Row], plan: SweepRecord | None = None, command: str | None = None,
           started: Sequence[Sequence[str]] = (), fit: Fit | None = None) -> Decision:
    """`plan`: the sweep's rounds.json (what was typed, what never started); `command`: the command line the
    runs came from, for the advice to run more rounds; `started`: every run's overrides; `fit`: the fit the
    rows' levels came from (harness.report.rows.row_set), built here only for rows handed over without it."""
    if fit is None:
        fit = row_fit(rows, planned=plan.planned if plan else None)
    state = standing(fit, [r.label for r in judged(rows)])
    never = plan.never_started([list(o) for o in started]) if plan else []
    return Decision(verdict(rows, fit, state, plan, command or (plan.command if plan else None), never),
                    reproducibility(rows, fit, state), winners(rows, state), state, fit.design.margin)


def winners(rows: Sequence[Row], state: Standing) -> dict[str, str]:
    """Column -> label of the row that is best by the rule: for throughput (and so time per PER iterations) the
    leader when the standing is decided with a winner; for memory, a largest device whose min-max over runs lies
    wholly below the next row's."""
    result = {}
    if state.decided == "winner":
        result["throughput"] = result["s_per_20"] = str(state.leader)
    mem = sorted(((m, r.label) for r in rows if r.throughput and (m := r.memory) is not None and m.max_mib is not None),
                 key=lambda pair: pair[0].max_mib or 0)
    if len(mem) >= 2 and mem[0][0].max_hi is not None and mem[1][0].max_lo is not None and \
            mem[0][0].max_hi < mem[1][0].max_lo:
        result["mem_max_mib"] = mem[0][1]
    return result


def _degrees(df: float) -> str:
    return f"{df:.0f} degree{'' if round(df) == 1 else 's'} of freedom"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')} run"


def _pct(log_sd: float) -> str:
    return f"{100 * (math.exp(log_sd) - 1):.1f} %"


def reproducibility(rows: Sequence[Row], fit: Fit, state: Standing) -> str:
    """How the intervals were made and judged, with the figures the rule used, in a few sentences."""
    design = fit.design
    parts = []
    timed = [r for r in rows if r.throughput]
    if fit.logs:
        spending = (f", {100 * FINAL_SHARE:.0f} % of a pair's at the last look (round {design.last_look}) and the rest "
                    f"over racing's looks before it (O'Brien-Fleming-type spending over {design.planned_rounds} planned "
                    "rounds)" if design.planned_rounds and design.planned_rounds > 2 else "")
        parts.append(f"each pair is judged on its own runs paired by round (a round's drift cancels): faster or slower "
                     f"when its interval excludes 1, equivalent when it lies within ±{100 * design.margin:.0f} % "
                     f"(verdict.margin); every interval keeps the sweep's {100 * design.alpha:.0f} % family-wise error "
                     f"rate over its {design.pairs} pair{'s' if design.pairs != 1 else ''}{spending}")
        if state.margin is not None and state.margin.sd is not None:
            m = state.margin
            how = f"per-round SD {_pct(m.sd)} over {m.rounds} rounds" if m.rounds else f"unpaired SD {_pct(m.sd)}"
            parts.append(f"{state.leader} against {state.runner_up}: {how} ({_degrees(m.df)}), tested at "
                         f"{m.level:.2g}")
        places = [p for p in fit.place_effects() if p.clear]
        if places:
            parts.append("a run's place in its round mattered on this machine: " + ", ".join(
                f"the {_ordinal(p.place)} ran at {p.ratio:.2f}×{interval_text(p.lo, p.hi)} the round's average"
                for p in places) + " (estimated from the sweep; the rounds' orders give every row every place "
                "alike, so it cancels in the pairs)")
        if fit.s_residual is not None:
            rounds = max((len(r.run_throughputs) for r in timed), default=0)
            parts.append(f"levels: each row at the sweep's average round (combination + round fit over up to {rounds} "
                         f"runs a row, fresh processes), 95 % intervals from the residual SD {_pct(fit.s_residual)} "
                         f"({_degrees(fit.df_residual)})")
    unknown = [r.label for r in timed if not r.spread_known and not r.busy]
    if unknown:
        parts.append("spread unknown (one run: no interval, no ★) for " + ", ".join(unknown))
    busy = [f"{r.label} ({r.busy})" for r in timed if r.busy]
    if busy:
        parts.append("measured only while the machine was busy, shown without an interval and not judged: "
                     + ", ".join(busy))
    left_out = [f"{r.label} ({r.busy_runs})" for r in timed if r.busy_runs and not r.busy]
    if left_out:
        parts.append("busy runs left out: " + ", ".join(left_out))
    return "; ".join(parts) or "no row has a steady window to measure"


def _interval(lo: float | None, hi: float | None, digits: int = 1, suffix: str = "") -> str:
    return f" [{lo:.{digits}f}–{hi:.{digits}f}{suffix}]" if lo is not None and hi is not None else ""


def _ratio_words(judged_: Judgement | None) -> str:
    if judged_ is None:
        return "?"
    return f"{judged_.ratio:.2f}×{interval_text(judged_.lo, judged_.hi)}"


def verdict(rows: Sequence[Row], fit: Fit, state: Standing, plan: SweepRecord | None = None,
            command: str | None = None, never: Sequence[str] = ()) -> str:
    """The sentence a reader acts on: the winner with its interval and its margin over the runner-up, or the
    rows equivalent within verdict.margin, or undecided with the pairs still open and the rounds that would
    decide them all; the rows found slower; what was not judged, did not run or never started."""
    ok = judged(rows)
    by_label = {r.label: r for r in rows}
    parts: list[str] = []
    if state.leader is None:
        busy = [r.label for r in rows if r.throughput and r.busy]
        parts.append("No verdict: every timed row was measured on a busy machine (" + ", ".join(busy) + ")." if busy
                     else _nothing_timed(rows))
    else:
        best = by_label[str(state.leader)]
        said = figure(best)
        m = state.margin
        if len(ok) == 1:
            parts.append(f"Only {best.label} was timed: {said}.")
        elif m is not None and not m.known:
            ahead = math.exp(fit.adjusted_log(best.label) - fit.adjusted_log(state.runner_up))
            shared = fit.rounds(best.label) & fit.rounds(state.runner_up)
            if all(fit.runs(r.label) < 2 for r in ok):
                why = _no_spread(plan, rows)
            elif not shared:
                why = (f"{best.label} and {state.runner_up} share no round in which both ran on a quiet machine, so "
                       "their ratio has no interval (more rounds on a quieter machine give one).")
            else:
                why = (f"{best.label} and {state.runner_up} share one round in which both ran on a quiet machine: "
                       "a ratio's spread needs two (more rounds give one).")
            parts.append(f"Highest measured: {best.label}, {figure(best, interval=False)}, {ahead:.2f}× "
                         f"{state.runner_up} by the round-adjusted levels; not judged: " + why)
        elif state.decided == "winner":
            parts.append(f"Fastest: {best.label}, {said}; {_ratio_words(m)} the runner-up {state.runner_up} "
                         f"(faster: its interval excludes 1).")
        elif state.decided == "tie":
            tied = [best.label, *map(str, state.tied)]
            parts.append(f"Equivalent within ±{100 * fit.design.margin:.0f} %: {', '.join(tied)} (the fastest measured: "
                         f"{best.label}, {said}).")
        else:
            still = [(k, fit.compare(k, state.leader)) for k in state.open]
            parts.append(f"Undecided: {best.label} ({said}) leads; still open against it: "
                         + ", ".join(f"{k} {_ratio_words(j)}" for k, j in still) + "; "
                         + _more_rounds([j for _, j in still], fit, plan, command))
        if work_per_sample(rows) and len(ok) > 1:
            parts.append("Ranked in tokens/s: the rows' samples hold different numbers of tokens.")
        if state.stopped:
            early = [(k, r) for k, r in state.stopped.items() if by_label[str(k)].stopped_early]
            later = [(k, r) for k, r in state.stopped.items() if not by_label[str(k)].stopped_early
                     and not (state.decided == "winner" and k == state.runner_up)]  # its margin is said above
            if early:
                parts.append("Stopped early, slower: " + _slower(early) + ".")
            if later:
                parts.append("Slower: " + _slower(later) + ".")
    busy = [r.label for r in rows if r.throughput and r.busy]
    if busy and state.leader is not None:
        parts.append("Not judged (every run measured while the machine was busy): " + ", ".join(busy) + ".")
    not_run = [r for r in rows if r.status != "ok"]
    if not_run:
        reasons: dict[str, list[str]] = {}
        for r in not_run:
            reasons.setdefault(r.status.split(" ")[0], []).append(r.label)
        parts.append("Did not run here: " + "; ".join(f"{len(v)} {k}" for k, v in reasons.items())
                     + " (reasons below).")
    if never:
        why = "the sweep was interrupted" if plan is not None and plan.interrupted else "the sweep ended first"
        parts.append(f"Never started ({why}): " + ", ".join(never) + ".")
    said = parity.summary(rows)
    if said:
        parts.append(said)
    return " ".join(parts)



def figure(best: Row, interval: bool = True) -> str:
    """`1199.2 img/s [95 % ...]`; a token model's in tokens/s; a workload of one's own in samples/s."""
    tokens = best.tokens_per_sample
    lo, hi = (best.throughput_lo, best.throughput_hi) if interval else (None, None)
    if tokens:
        return (f"{best.throughput * tokens:.0f} tokens/s"
                + _interval(lo and lo * tokens, hi and hi * tokens, digits=0))
    unit = "samples/s" if best.model_sample == "samples" else "img/s"
    return f"{best.throughput:.1f} {unit}{_interval(lo, hi)}"

def _no_spread(plan: SweepRecord | None, rows: Sequence[Row]) -> str:
    """Why every row has one run, in the terms of what was typed."""
    repeats = {r.config.get("repeat") for r in rows if r.config}
    if plan is not None and plan.interrupted:
        of = f" of repeat={plan.repeat}" if plan.repeat else ""
        return (f"the sweep was interrupted in round {plan.rounds_started}{of}, with one run per row: one run has "
                "no spread between processes (run the sweep again to finish it).")
    if repeats == {1}:
        return "repeat=1 gives one run per row, and one run has no spread between processes (repeat=N with N >= 2, " \
               "or racing with repeat unset, gives one)."
    return "one run per row has no spread between processes (a sweep's rounds, or repeat=N, give one)."


def _more_rounds(open_pairs: Sequence[Judgement | None], fit: Fit, plan: SweepRecord | None,
                 command: str | None) -> str:
    """What would decide every pair still open, planned for the margin (never from the ratios observed): the
    rounds to tell a margin's difference apart and to show equal rows within it, the largest over the open
    pairs (each at its own spread), and the command that runs them."""
    advice = [a for j in open_pairs if j is not None and (a := j.advice) is not None]
    if not advice:
        return "no estimate of what would decide it (no spread between rounds yet)."
    worst = max(advice, key=lambda a: a.rounds)
    margin, twice = f"{100 * fit.design.margin:.0f} %", f"{100 * ((1 + fit.design.margin) ** 2 - 1):.0f} %"
    spread = f"the noisiest open pair's per-round SD {_pct(worst.sd)}"
    tell, within = max(a.tell for a in advice), max(a.within for a in advice)
    tell_twice = max(a.tell_twice for a in advice)
    pace = statistics.median(plan.round_seconds) if plan and plan.round_seconds else None
    if worst.possible:
        n, what = worst.rounds, (f"to tell {margin} apart: {_rounds(tell)}; to show them within ±{margin}: "
                                 f"{_rounds(within)} (at {spread})")
    elif tell_twice <= MAX_ROUNDS_ADVISED:
        n, what = tell_twice, (f"at {spread}, neither {margin} apart nor within ±{margin} can be told in "
                               f"{MAX_ROUNDS_ADVISED} rounds (verdict.margin); to tell {twice} apart: {_rounds(tell_twice)}")
    else:
        return (f"at {spread}, no number of rounds up to {MAX_ROUNDS_ADVISED} would tell {margin} (or {twice}) apart or "
                f"show them within ±{margin} (verdict.margin).")
    took = f", about {math.ceil(n * pace / 60)} min at this sweep's pace" if pace else ""
    return f"{what}{took}: {rerun(command, n, pace)}."


def _rounds(n: int) -> str:
    return f"more than {MAX_ROUNDS_ADVISED} rounds" if n > MAX_ROUNDS_ADVISED else f"{n} rounds"


SEARCH = re.compile(r"^search(\.enabled)?=(true|True|1)$")


def rerun(command: str | None, rounds: int, round_s: float | None = None) -> str:
    """The command line as typed with `repeat=N` (and no budget: exactly N rounds). A search's gets instead the
    budget of N rounds at its pace (`search.budget_s`), so that it goes on racing, stopping what the rule finds
    slower, rather than running every candidate it races N times."""
    words = [w for w in (command or "python run.py -m").split()
             if not re.match(r"^(repeat|timing\.budget_s|round|hydra\.sweep\.dir)=", w)]
    if words and words[0] == "run.py":
        words.insert(0, "python")
    if round_s and any(SEARCH.match(w) for w in words):
        budget = 60 * math.ceil(rounds * round_s / 60)
        return " ".join([*(w for w in words if not w.startswith("search.budget_s=")), f"search.budget_s={budget}"])
    return " ".join([*words, f"repeat={rounds}"])


def _slower(found: Sequence[tuple[Any, Judgement]]) -> str:
    """The closest few by name with their ratio to the leader, then how many more and their range."""
    ranked = sorted(found, key=lambda item: item[1].ratio, reverse=True)
    named = [f"{k} {_ratio_words(r)}" for k, r in ranked[:SLOWER_NAMED]]
    rest = ranked[SLOWER_NAMED:]
    if rest:
        named.append(f"{len(rest)} more at {rest[-1][1].ratio:.2f}–{rest[0][1].ratio:.2f}× the leader")
    return ", ".join(named)


def _nothing_timed(rows: Sequence[Row]) -> str:
    untimed = [r.label for r in rows if r.status == "ok" and not r.throughput]
    if untimed:  # ran, but no window after warm-up (parity runs)
        return (f"No timing: {', '.join(untimed)} ran without a steady window (too few iterations for one after "
                "warm-up; allowed with parity=true).")
    return "No combination finished here."
