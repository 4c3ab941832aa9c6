"""Two sweeps side by side (`python -m harness.report --compare A B`): what differs between the machines and
versions they ran on, and per row both have, B's throughput over A's with a 95 % interval and a word.

The unit that varies is the run (a fresh process), so the interval comes from the runs of each row: Welch's
t-interval on the difference of mean log throughputs (the ratio of geometric means), which needs two runs
or more on each side (`repeat=N`); with fewer, the ratio is given without an interval and no word is said.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import ConfigError
from harness.core.results import RunRecord
from harness.report.rows import Combination, Row, build_rows, find_results

# Environment fields worth naming when they differ (hostnames and commands differ between any two sweeps)
COMPARED = ("torch", "torch_built_for_cuda", "python", "packages", "harness_commit", "cpu", "cpu_capability",
            "gpu_names", "driver", "platform")


@dataclass(frozen=True)
class Ratio:
    label: str
    ratio: float  # B's median throughput over A's
    low: float | None  # 95 % interval of the ratio of geometric means; None: fewer than 2 runs a side
    high: float | None
    runs: tuple[int, int]

    @property
    def word(self) -> str:
        if self.low is None or self.high is None:
            return "unknown (one run a side: repeat=N gives an interval)"
        if self.low > 1:
            return "faster"
        if self.high < 1:
            return "slower"
        return "same (the interval holds 1)"


def ratio(label: str, a: Sequence[float], b: Sequence[float]) -> Ratio:
    """B over A from each side's per-run throughputs."""
    point = statistics.median(b) / statistics.median(a)
    if len(a) < 2 or len(b) < 2:
        return Ratio(label, point, None, None, (len(a), len(b)))
    from scipy import stats

    log_a, log_b = [math.log(x) for x in a], [math.log(x) for x in b]
    if statistics.pvariance(log_a) == 0 and statistics.pvariance(log_b) == 0:  # identical runs: no spread at all
        low = high = math.exp(statistics.fmean(log_b) - statistics.fmean(log_a))
    else:
        with warnings.catch_warnings():  # one side's runs all alike: scipy warns of precision, the interval holds
            warnings.simplefilter("ignore", RuntimeWarning)
            interval = stats.ttest_ind(log_b, log_a, equal_var=False).confidence_interval(0.95)
        low, high = math.exp(interval.low), math.exp(interval.high)
    return Ratio(label, point, low, high, (len(a), len(b)))


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
    ratios = [ratio(rows_b[key].label, rows_a[key].run_rates, rows_b[key].run_rates) for key in common]
    return environment_differences([r for _, r in found_a], [r for _, r in found_b]), ratios


def _ok_rows(found: Sequence[tuple[Path, RunRecord]]) -> dict[Combination, Row]:
    """A sweep's rows that ran, by their combination (rows of two sweeps match on it, not on the label)."""
    rows, _ = build_rows(found)
    keys = list(dict.fromkeys(Combination.of(r) for _, r in found))  # build_rows' order of rows
    return {key: row for key, row in zip(keys, rows, strict=True) if row.run_rates}


def lines(a: Path, b: Path, env: Sequence[str], ratios: Sequence[Ratio]) -> list[str]:
    out = [f"A: {a}", f"B: {b}", "What differs between the two sweeps' machines and versions:"]
    out += [f"  {line}" for line in env] or ["  nothing recorded differs"]
    out.append("Per row, B's throughput over A's (95 % interval from the runs of each side):")
    width = max(len(r.label) for r in ratios)
    for r in ratios:
        interval = f"[{r.low:.2f}–{r.high:.2f}]" if r.low is not None and r.high is not None else "[no interval]"
        out.append(f"  {r.label:<{width}}  {r.ratio:.2f}× {interval}  runs {r.runs[0]}/{r.runs[1]}  {r.word}")
    return out
