"""A sweep in rounds: every combination runs once before any runs again, in orders of a Williams design (each
row takes each place in the round equally often, and follows each other row equally often), so a place that
costs (the first run after the sweep's pause, a cache cooled by the report) and the run before it fall to every
row alike; with `repeat=N` exactly N rounds, otherwise racing (harness.verdict.racing) within `timing.budget_s`:
after the first round the rounds that fit the budget are planned (the group-sequential design's maximum,
harness.verdict.rule), and after each round from the second the rule stops what is slower than the leader,
until the top is decided or the plan is done. Launcher-agnostic: `launch(jobs)` runs a list of override lists
and returns each job's results (a dict, or None for a job that returned none)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harness.core.results import RunRecord
from harness.verdict.intervals import Fit, Observation
from harness.verdict.racing import Standing, standing
from harness.verdict.rule import MIN_ROUNDS, Design, Judgement, interval_text

MAX_PLANNED_ROUNDS = 100  # a racing sweep plans no more rounds than this, whatever its budget

log = logging.getLogger(__name__)

Launch = Callable[[list[list[str]], int], list[RunRecord | None]]


@dataclass
class RoundsOutcome:
    rounds: int = 0
    runs: int = 0
    planned: int | None = None  # the design's maximum of rounds (racing), or repeat
    stopped: dict[int, int] = field(default_factory=dict)  # combination -> the last round it ran
    busy_only: list[int] = field(default_factory=list)  # left out of the race: every run busy
    started: int = 0  # rounds begun (one more than `rounds` while a round runs)
    round_seconds: list[float] = field(default_factory=list)
    orders: list[list[int]] = field(default_factory=list)  # each round's combinations, in the order they ran
    ended_by: str = ""  # "repeat", "decided: <how>", "budget", "planned rounds", "no combination left"


NAMED_BY_THE_FOLDER = ("strategy", "amp")  # the default folder pattern names these already


def _varying(combinations: Sequence[list[str]]) -> tuple[list[str], list[dict[str, str]]]:
    """The keys the sweep varies besides strategy and amp, and each combination's own values."""
    values: dict[str, set[str]] = {}
    for combination in combinations:
        for override in combination:
            key, _, value = override.lstrip("+~").partition("=")
            values.setdefault(key, set()).add(value)
    varying = sorted(k for k, v in values.items() if len(v) > 1 and k not in NAMED_BY_THE_FOLDER)
    return varying, [dict(o.lstrip("+~").partition("=")[::2] for o in c) for c in combinations]


def variant_suffixes(combinations: Sequence[list[str]]) -> list[str]:
    """Per combination, the settings the sweep varies besides strategy and amp, for its folder's name
    (`_comm_hook-fp16`, `_grad_accum-4`): variants of one strategy and amp level get folders that say which is
    which. Options of a strategy are named short; characters a path cannot hold become `-`; one fixed order."""
    varying, owns = _varying(combinations)
    return ["".join(f"_{key.removeprefix('strategy.')}-{re.sub(r'[^A-Za-z0-9._+-]+', '-', own[key])}"
                    for key in varying if key in own) for own in owns]


def combination_names(combinations: Sequence[list[str]], describe: Callable[[int], str]) -> list[str]:
    """`single O0 iterations=40`: what the logs and the report call each combination before it has a row."""
    varying, owns = _varying(combinations)
    return [" ".join([describe(i), *(f"{key.removeprefix('strategy.')}={own[key]}" for key in varying if key in own)])
            for i, own in enumerate(owns)]


def williams(k: int) -> list[list[int]]:
    """A Williams design for k rows: k orders (2k for odd k, the square and its mirror) in which every row takes
    every place equally often and follows every other row equally often (Williams 1949). Its first order is
    0, 1, k-1, 2, k-2, ...; each next order adds 1 to every entry, mod k."""
    if k <= 1:
        return [list(range(k))]
    first, low, high = [0], 1, k - 1
    while len(first) < k:
        first.append(low)
        low += 1
        if len(first) < k:
            first.append(high)
            high -= 1
    square = [[(x + shift) % k for x in first] for shift in range(k)]
    return square if k % 2 == 0 else square + [list(reversed(order)) for order in square]


def balanced_order(contenders: list[int], since: int) -> list[int]:
    """The order of a round's runs: the `since`-th order (0 for the first round with this set of rows) of a
    Williams design over the contenders as listed. When racing stops a row the design starts again over the
    rows left, so that the places stay balanced among the rows still compared."""
    design = williams(len(contenders))
    return [contenders[i] for i in design[since % len(design)]]


def starting_after(contenders: list[int], first_before: int) -> list[int]:
    """The rows left, rotated so that the new design's first order does not open with the row that opened the
    round before (a restarted design would put the same row first twice running, in the place that costs most:
    the first after the sweep's pause). Rotating the rows keeps every balance of the design."""
    if len(contenders) > 1 and contenders[0] == first_before:
        return contenders[1:] + contenders[:1]
    return list(contenders)


def round_overrides(combination: list[str], index: int, number: int, subdir_template: str,
                    suffix: str = "", place: int | None = None, after: int | None = None) -> list[str]:
    """A job's overrides in round `number`: its round, its place in it and the combination run before it (where
    given); its folder named as the combination is in round 1 (its
    number, and what sets it apart from its peers: `3_ddp_O0_comm_hook-fp16`), from the second round on in a
    folder of the round's own beside the first round's (`round-2/3_ddp_O0_comm_hook-fp16`)."""
    extra = [f"round={number}"]
    if place is not None:
        extra.append(f"place={place}")
    if after is not None:
        extra.append(f"after={after}")
    if number > 1 or suffix:
        subdir = subdir_template.replace("${hydra.job.num}", str(index)) + suffix
        extra.append(f"hydra.sweep.subdir='{f'round-{number}/' if number > 1 else ''}{subdir}'")
    return [*combination, *extra]


def observations(index: int, number: int, result: RunRecord | None, place: int | None = None) -> list[Observation]:
    """A run that measured a throughput on a quiet machine, as the report judges it (RunRecord.quiet); a busy
    one is kept out (it would mislead)."""
    if result is None or not result.quiet:
        return []
    return [Observation(index, number, float(result.throughput_img_s or 0), place)]


def plan_rounds(budget_s: float, elapsed_s: float, round_s: float) -> int:
    """A racing sweep's maximum of rounds, fixed after round 2 and before its first look (so no comparison can
    move it): the MIN_ROUNDS run so far and as many more as the rest of the budget holds at round 2's pace (the
    first round also pays the sweep's one-time start-up)."""
    if round_s <= 0:
        return MAX_PLANNED_ROUNDS
    more = int(max(0.0, budget_s - elapsed_s) // round_s)
    return max(MIN_ROUNDS, min(MAX_PLANNED_ROUNDS, MIN_ROUNDS + more))


def run_rounds(combinations: Sequence[list[str]], launch: Launch, repeat: int | None, budget_s: float,
               subdir_template: str, describe: Callable[[int], str], margin: float = 0.05,
               clock: Callable[[], float] = time.monotonic,
               progress: Callable[[RoundsOutcome], None] = lambda outcome: None) -> RoundsOutcome:
    """`progress(outcome)`: called as each round begins and when the rounds end (the sweep's rounds.json)."""
    outcome = RoundsOutcome(planned=repeat)
    suffixes = variant_suffixes(combinations)
    contenders = list(range(len(combinations)))
    found: list[Observation] = []
    started = clock()
    job = 0
    number = 0
    family = 0  # the rows that entered the race (ran in round 1): every pair of them may be worded
    previous: int | None = None  # the combination run last
    rows, design_rows, since = list(contenders), list(contenders), 0  # the design in use, and its rounds so far
    while contenders:
        number += 1
        round_started = clock()
        if contenders != rows:
            rows, design_rows, since = list(contenders), starting_after(contenders, outcome.orders[-1][0]), 0
        order = balanced_order(design_rows, since)
        since += 1
        outcome.orders.append(list(order))
        jobs = []
        for place, c in enumerate(order, start=1):
            jobs.append(round_overrides(combinations[c], c, number, subdir_template, suffixes[c], place, previous))
            previous = c
        if number > 1:
            log.info("round %d of %s: %s", number, outcome.planned or "?", ", ".join(describe(c) for c in order))
        outcome.started = number
        progress(outcome)
        results = dict(zip(order, launch(jobs, job), strict=True))
        job += len(jobs)
        outcome.rounds, outcome.runs = number, outcome.runs + len(jobs)
        ran_ok = []
        for c in contenders:
            found += observations(c, number, results[c], order.index(c) + 1)
            if results[c] is not None and results[c].status == "ok":
                ran_ok.append(c)
        round_seconds = clock() - round_started
        outcome.round_seconds.append(round_seconds)
        contenders = ran_ok  # a combination that failed or was skipped is not run again
        if number == 1:
            family = len(ran_ok)
        if number == MIN_ROUNDS and repeat is None:
            outcome.planned = plan_rounds(budget_s, clock() - started, round_seconds)
            log.info("racing: up to %d rounds planned (round %d took %.0f s; timing.budget_s=%g s); after each, what "
                     "the rule finds slower than the leader stops", outcome.planned, number, round_seconds, budget_s)
        if repeat is not None:
            if number >= repeat:
                outcome.ended_by = "repeat"
                break
            continue
        if number < MIN_ROUNDS:
            continue
        quiet = {o.key for o in found}
        for c in [c for c in contenders if c not in quiet]:
            outcome.busy_only.append(c)
            log.info("not judged: %s was measured only while the machine was busy; it is not run again", describe(c))
        contenders = [c for c in contenders if c in quiet]
        fit = Fit(found, Design(pairs=Design.family(family), planned_rounds=outcome.planned, margin=margin,
                                look=number))
        state = standing(fit, contenders)
        for c, judged in state.stopped.items():
            outcome.stopped[int(c)] = number
            log.info("stopped early: %s slower than %s, %s", describe(int(c)), describe(int(state.leader)),
                     said(judged))
        contenders = [c for c in contenders if c not in state.stopped]
        if state.decided:
            outcome.ended_by = f"decided: {state.decided}"
            log.info("%s", _decided(state, describe, number))
            break
        assert outcome.planned is not None
        if number >= outcome.planned:
            outcome.ended_by = "planned rounds"
            log.info("rounds end after round %d, the last the plan holds; the top is not decided", number)
            break
        expected = round_seconds * len(contenders) / max(1, len(ran_ok))
        if clock() - started + expected > budget_s:
            outcome.ended_by = "budget"
            log.info("rounds end after round %d: another (about %.0f s) would pass timing.budget_s=%g s; the top "
                     "is not decided", number, expected, budget_s)
            break
    if not outcome.ended_by:
        outcome.ended_by = "no combination left"
    progress(outcome)
    return outcome


def said(judged: Judgement) -> str:
    """`0.73x [0.55-0.96], 4 rounds paired, tested at 0.0021`: a judgement as the logs give it."""
    interval = interval_text(judged.lo, judged.hi)
    how = f"{judged.rounds} rounds paired" if judged.rounds else "unpaired"
    return f"{judged.ratio:.2f}x{interval}, {how}, tested at {judged.level:.2g}" if judged.level else \
        f"{judged.ratio:.2f}x{interval}, {how}"


def _decided(state: Standing, describe: Callable[[int], str], number: int) -> str:
    leader = describe(int(state.leader))
    if state.decided == "tie":
        return f"rounds end after round {number}: {leader} and " + ", ".join(describe(int(k)) for k in state.tied) \
            + " are equivalent within verdict.margin (the rest slower)"
    if state.decided == "alone":
        return f"rounds end after round {number}: {leader} is the only combination left"
    return f"rounds end after round {number}: {leader} is faster than every other combination"
