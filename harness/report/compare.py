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
from harness.verdict.rule import Design, interval_text, unpaired

# Environment fields worth naming when they differ (hostnames and commands differ between any two sweeps)
COMPARED = ("torch", "torch_built_for_cuda", "python", "packages", "harness_commit", "cpu", "cpu_capability",
            "gpu_names", "driver", "platform")


@dataclass(frozen=True)
class Ratio:
    label: str
    ratio: float | None  # B's geometric mean throughput over A's; None: no timed run on one side (`missing`)
    low: float | None  # 95 % interval; None: no spread between runs to tell it by (one run a row, everywhere)
    high: float | None
    runs: tuple[int, int]
    judged: str = "undecided"  # the rule's word: faster, slower, equivalent, undecided
    margin: float = Design.margin
    level: float | None = None  # the two-sided level each row was tested at
    missing: str | None = None  # no ratio: which side the row's runs are missing from ("only in B: no run in A")

    @property
    def word(self) -> str:
        if self.missing is not None:
            return self.missing
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
    rows_a, rows_b = _rows(found_a), _rows(found_b)
    if not any(rows_a[key].run_rates and rows_b[key].run_rates for key in rows_a if key in rows_b):
        raise ConfigError("--compare", f"{a} {b}", "two sweeps with a combination in common that ran in both "
                          "(same model, batch, image size, settings; A has "
                          f"{', '.join(r.label for r in rows_a.values() if r.run_rates) or 'none'}; B has "
                          f"{', '.join(r.label for r in rows_b.values() if r.run_rates) or 'none'})")
    # both sweeps hold the combination and one of them timed it; a ratio only where both have quiet runs
    common = [key for key in rows_a if key in rows_b and (rows_a[key].run_rates or rows_b[key].run_rates)]
    both = [key for key in common if rows_a[key].run_throughputs and rows_b[key].run_throughputs]
    judged = dict(zip(both, ratios(
        {rows_b[key].label: ([v for _, v in rows_a[key].run_throughputs], [v for _, v in rows_b[key].run_throughputs])
         for key in both}, sweep_design(list(rows_b.values())).margin), strict=True))
    found = [judged[key] if key in judged else _one_sided(rows_a[key], rows_b[key]) for key in common]
    return environment_differences([r for _, r in found_a], [r for _, r in found_b]), found


def _rows(found: Sequence[tuple[Path, RunRecord]]) -> dict[Combination, Row]:
    """A sweep's rows by their combination (rows of two sweeps match on it, not on the label)."""
    rows, _ = build_rows(found)
    keys = list(dict.fromkeys(Combination.of(r) for _, r in found))  # build_rows' order of rows
    return dict(zip(keys, rows, strict=True))


def _one_sided(row_a: Row, row_b: Row) -> Ratio:
    """A row without a quiet timed run on one side (or either): no ratio, just where its runs are missing."""
    def none(row: Row, side: str) -> str:
        return f"no run in {side}" if not row.run_rates else f"no quiet run in {side} (timed while the machine was busy)"

    runs = (len(row_a.run_throughputs), len(row_b.run_throughputs))
    if row_a.run_throughputs:
        return Ratio(row_b.label, None, None, None, runs, missing=f"only in A: {none(row_b, 'B')}")
    if row_b.run_throughputs:
        return Ratio(row_b.label, None, None, None, runs, missing=f"only in B: {none(row_a, 'A')}")
    return Ratio(row_b.label, None, None, None, runs, missing=f"in neither: {none(row_a, 'A')}, {none(row_b, 'B')}")


def lines(a: Path, b: Path, env: Sequence[str], found: Sequence[Ratio]) -> list[str]:
    out = [f"A: {a}", f"B: {b}", "What differs between the two sweeps' machines and versions:"]
    out += [f"  {line}" for line in env] or ["  nothing recorded differs"]
    level = next((r.level for r in found if r.level is not None), None)
    compared = sum(r.ratio is not None for r in found)
    out.append("Per row, B's throughput over A's (geometric means; Welch's interval from each side's runs"
               + (f", at level {level:.2g}: the 5 % family-wise rate over the {compared} rows compared" if level else "")
               + "):")
    width = max(len(r.label) for r in found)
    for r in found:
        if r.ratio is None:
            out.append(f"  {r.label:<{width}}  {r.word}")
            continue
        interval = interval_text(r.low, r.high) or " [no interval]"
        out.append(f"  {r.label:<{width}}  {r.ratio:.2f}×{interval}  runs {r.runs[0]}/{r.runs[1]}  {r.word}")
    return out
