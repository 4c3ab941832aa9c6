"""Two sweeps side by side (`python -m harness.report --compare A B`): what differs between the machines and
versions they ran on, and per row both have, B's throughput over A's with a 95 % interval and a word.

The unit that varies is the run (a fresh process), so the interval comes from the runs, and the word from the
same rule as a sweep's own verdict (harness.verdict.rule): runs of two sweeps share no round, so each row is
compared unpaired (Welch's interval on the log rates, each side's own spread), at the 5 % family-wise rate over
the rows compared: `faster`/`slower` when the interval excludes 1, `equivalent` when it lies within
verdict.margin, else `undecided`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import ConfigError
from harness.core.results import RunRecord
from harness.report.rows import Combination, Row, build_rows, find_results, sweep_design
from harness.verdict.rule import Design, unpaired

# Environment fields worth naming when they differ (hostnames and commands differ between any two sweeps)
COMPARED = ("torch", "torch_built_for_cuda", "python", "packages", "harness_commit", "cpu", "cpu_capability",
            "gpu_names", "driver", "platform")


@dataclass(frozen=True)
class Ratio:
    label: str
    ratio: float  # B's geometric mean throughput over A's
    low: float | None  # 95 % interval; None: no spread between runs to tell it by (one run a row, everywhere)
    high: float | None
    runs: tuple[int, int]
    judged: str = "undecided"  # the rule's word: faster, slower, equivalent, undecided
    margin: float = Design.margin
    level: float | None = None  # the two-sided level each row was tested at

    @property
    def word(self) -> str:
        if self.low is None or self.high is None:
            return "unknown (fewer than two runs on a side: a sweep's rounds or repeat=N give an interval)"
        if self.judged == "equivalent":
            return f"equivalent (within ±{100 * self.margin:.0f} %)"
        if self.judged == "undecided":
            return "undecided (more runs on both sides would tell)"
        return self.judged


def ratios(pairs: Mapping[str, tuple[Sequence[float], Sequence[float]]], margin: float = Design.margin,
           ) -> list[Ratio]:
    """B over A for each row (label -> (A's run throughputs, B's)), each judged unpaired by the rule, the family
    every row compared."""
    design = Design(pairs=len(pairs), margin=margin)
    found = []
    for label, (a, b) in pairs.items():
        judged = unpaired([math.log(v) for v in b if v > 0], [math.log(v) for v in a if v > 0], design)
        found.append(Ratio(label, judged.ratio, judged.lo, judged.hi, (len(a), len(b)), judged.word, margin,
                           judged.level))
    return found


def ratio(label: str, a: Sequence[float], b: Sequence[float]) -> Ratio:
    """B over A for one row alone."""
    return ratios({label: (a, b)})[0]


def environment_differences(a: Sequence[RunRecord], b: Sequence[RunRecord]) -> list[str]:
    """`torch: 2.14.1+cu130 → 2.15.0+cu132` for each compared field whose values differ between the sweeps."""
    lines = []
    for name in COMPARED:
        before, after = _values(a, name), _values(b, name)
        if before != after:
            lines.append(f"{name}: {before} → {after}")
    return lines


def _values(records: Sequence[RunRecord], name: str) -> str:
    seen: list[str] = []
    for env in (r.env for r in records if r.env.torch is not None or r.env.cpu is not None):
        value = getattr(env, name)
        text = ", ".join(f"{k} {v}" for k, v in sorted(value.items())) if isinstance(value, dict) else \
            ", ".join(value) if isinstance(value, list) else str(value)
        if text not in seen:
            seen.append(text)
    return " | ".join(seen) or "unknown"


def compare(a: Path, b: Path) -> tuple[list[str], list[Ratio]]:
    """The environment lines and the ratios of the rows both sweeps ran; ConfigError when there is nothing
    to compare."""
    found_a, found_b = find_results([a])[0], find_results([b])[0]
    for path, found in ((a, found_a), (b, found_b)):
        if not found:
            raise ConfigError("--compare", str(path), "two folders holding results.json files")
    rows_a, rows_b = _ok_rows(found_a), _ok_rows(found_b)
    common = [key for key in rows_a if key in rows_b]
    if not common:
        raise ConfigError("--compare", f"{a} {b}", "two sweeps with a combination in common that ran in both "
                          "(same model, batch, image size, settings; A has "
                          f"{', '.join(r.label for r in rows_a.values()) or 'none'}; B has "
                          f"{', '.join(r.label for r in rows_b.values()) or 'none'})")
    found = ratios({rows_b[key].label: ([v for _, v in rows_a[key].run_throughputs], [v for _, v in rows_b[key].run_throughputs])
                    for key in common}, sweep_design(list(rows_b.values())).margin)
    return environment_differences([r for _, r in found_a], [r for _, r in found_b]), found


def _ok_rows(found: Sequence[tuple[Path, RunRecord]]) -> dict[Combination, Row]:
    """A sweep's rows that ran, by their combination (rows of two sweeps match on it, not on the label)."""
    rows, _ = build_rows(found)
    keys = list(dict.fromkeys(Combination.of(r) for _, r in found))  # build_rows' order of rows
    return {key: row for key, row in zip(keys, rows, strict=True) if row.run_rates}


def lines(a: Path, b: Path, env: Sequence[str], found: Sequence[Ratio]) -> list[str]:
    out = [f"A: {a}", f"B: {b}", "What differs between the two sweeps' machines and versions:"]
    out += [f"  {line}" for line in env] or ["  nothing recorded differs"]
    level = next((r.level for r in found if r.level is not None), None)
    out.append("Per row, B's throughput over A's (geometric means; Welch's interval from each side's runs"
               + (f", at level {level:.2g}: the 5 % family-wise rate over the {len(found)} rows compared" if level else "")
               + "):")
    width = max(len(r.label) for r in found)
    for r in found:
        interval = f"[{r.low:.2f}–{r.high:.2f}]" if r.low is not None and r.high is not None else "[no interval]"
        out.append(f"  {r.label:<{width}}  {r.ratio:.2f}× {interval}  runs {r.runs[0]}/{r.runs[1]}  {r.word}")
    return out
