"""A sweep in rounds: every combination runs once before any runs again (A B C D, A B C D), so a shared
machine's drift hits every row alike; with `repeat=N` exactly N rounds, otherwise racing (harness.verdict.racing)
within `timing.budget_s`. Launcher-agnostic: `launch(jobs)` runs a list of override lists and returns each
job's results (a dict, or None for a job that returned none)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.verdict.intervals import Fit, Observation
from harness.verdict.racing import MIN_ROUNDS, Standing, standing

log = logging.getLogger(__name__)

Launch = Callable[[list[list[str]], int], list[dict[str, Any] | None]]


@dataclass
class RoundsOutcome:
    rounds: int = 0
    runs: int = 0
    stopped: dict[int, int] = field(default_factory=dict)  # combination -> the last round it ran
    ended_by: str = ""  # "repeat", "decided: <how>", "budget", "no combination left"


NAMED_BY_THE_FOLDER = ("strategy", "amp")  # the default folder pattern names these already


def variant_suffixes(combinations: Sequence[list[str]]) -> list[str]:
    """Per combination, the settings the sweep varies besides strategy and amp, for its folder's name
    (`_comm_hook-fp16`, `_grad_accum-4`): variants of one strategy and amp level get folders that say which is
    which. Options of a strategy are named short; characters a path cannot hold become `-`; one fixed order."""
    values: dict[str, set[str]] = {}
    for combination in combinations:
        for override in combination:
            key, _, value = override.lstrip("+~").partition("=")
            values.setdefault(key, set()).add(value)
    varying = sorted(k for k, v in values.items() if len(v) > 1 and k not in NAMED_BY_THE_FOLDER)
    suffixes = []
    for combination in combinations:
        own = dict(o.lstrip("+~").partition("=")[::2] for o in combination)
        words = [f"{key.removeprefix('strategy.')}-{re.sub(r'[^A-Za-z0-9._+-]+', '-', own[key])}"
                 for key in varying if key in own]
        suffixes.append("".join(f"_{w}" for w in words))
    return suffixes


def round_overrides(combination: list[str], index: int, number: int, subdir_template: str,
                    suffix: str = "") -> list[str]:
    """A job's overrides in round `number`: its round; its folder named as the combination is in round 1 (its
    number, and what sets it apart from its peers: `3_ddp_O0_comm_hook-fp16`), from the second round on in a
    folder of the round's own beside the first round's (`round-2/3_ddp_O0_comm_hook-fp16`)."""
    extra = [f"round={number}"]
    if number > 1 or suffix:
        subdir = subdir_template.replace("${hydra.job.num}", str(index)) + suffix
        extra.append(f"hydra.sweep.subdir='{f'round-{number}/' if number > 1 else ''}{subdir}'")
    return [*combination, *extra]


def observations(index: int, number: int, result: dict[str, Any] | None) -> list[Observation]:
    """A run that measured a throughput on a quiet machine; a busy one is kept out (it would mislead)."""
    if not result or result.get("status") != "ok" or not result.get("throughput_img_s"):
        return []
    if (result.get("machine") or {}).get("busy"):
        return []
    return [Observation(index, number, float(result["throughput_img_s"]))]


def run_rounds(combinations: Sequence[list[str]], launch: Launch, repeat: int | None, budget_s: float,
               subdir_template: str, describe: Callable[[int], str],
               clock: Callable[[], float] = time.monotonic) -> RoundsOutcome:
    outcome = RoundsOutcome()
    suffixes = variant_suffixes(combinations)
    contenders = list(range(len(combinations)))
    found: list[Observation] = []
    started = clock()
    job = 0
    number = 0
    while contenders:
        number += 1
        round_started = clock()
        jobs = [round_overrides(combinations[c], c, number, subdir_template, suffixes[c]) for c in contenders]
        if number > 1:
            log.info("round %d%s: %s", number, f" of {repeat}" if repeat else "",
                     ", ".join(describe(c) for c in contenders))
        results = launch(jobs, job)
        job += len(jobs)
        outcome.rounds, outcome.runs = number, outcome.runs + len(jobs)
        ran_ok = []
        for c, result in zip(contenders, results, strict=True):
            found += observations(c, number, result)
            if result and result.get("status") == "ok":
                ran_ok.append(c)
        round_seconds = clock() - round_started
        contenders = ran_ok  # a combination that failed or was skipped is not run again
        if repeat is not None:
            if number >= repeat:
                outcome.ended_by = "repeat"
                break
            continue
        if number < MIN_ROUNDS:
            continue
        fit = Fit(found)
        state = standing(fit, contenders)
        for c, ratio in state.stopped.items():
            outcome.stopped[int(c)] = number
            log.info("stopped early: %s clearly slower, %.2fx [%.2f-%.2f] %s", describe(int(c)), ratio.point,
                     ratio.lo, ratio.hi, describe(int(state.leader)))
        contenders = [c for c in contenders if c not in state.stopped]
        if state.decided:
            outcome.ended_by = f"decided: {state.decided}"
            log.info("%s", _decided(state, describe, number))
            break
        expected = round_seconds * len(contenders) / max(1, len(ran_ok))
        if clock() - started + expected > budget_s:
            outcome.ended_by = "budget"
            log.info("rounds end after round %d: another (about %.0f s) would pass timing.budget_s=%g s; the top "
                     "is not decided", number, expected, budget_s)
            break
    if not outcome.ended_by:
        outcome.ended_by = "no combination left"
    return outcome


def _decided(state: Standing, describe: Callable[[int], str], number: int) -> str:
    leader = describe(int(state.leader))
    if state.decided == "tie":
        return f"rounds end after round {number}: {leader} and " + ", ".join(describe(int(k)) for k in state.tied) \
            + " are within the noise of each other"
    return f"rounds end after round {number}: {leader} is ahead of every other combination beyond the noise"
