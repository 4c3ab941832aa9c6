"""Two sweeps side by side (`python -m harness.report --compare A B`): what differs between the machines and
versions they ran on, and per row both have, B's throughput over A's with a 95 % interval and a word.

The unit that varies is the run (a fresh process), so the interval comes from the runs, as in a sweep's own
verdict (harness.verdict.intervals): the ratio of geometric means, with a t-interval whose spread is the runs'
scatter around their row's mean, pooled over every row of both sweeps (runs of two sweeps share no round, so
nothing is paired), and a word only beyond the minimum effect (how far one run strays from its row's mean 95 %
of the time): `faster`/`slower`, `same` (the whole interval within it), or `undecided`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import ConfigError
from harness.core.results import RunRecord
from harness.report.rows import Combination, Row, build_rows, find_results
from harness.verdict.intervals import Fit, Observation

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
    judged: str = "undecided"  # harness.verdict's judgement: faster, slower, same, undecided
    min_effect: float | None = None

    @property
    def word(self) -> str:
        if self.low is None or self.high is None:
            return "unknown (one run a row: a sweep's rounds or repeat=N give an interval)"
        if self.judged == "same":
            return f"same (within {100 * (self.min_effect or 0):.0f} %)"
        if self.judged == "undecided":
            return "undecided (within the noise: more runs would tell)"
        return self.judged


SIDE_B = 1_000_000  # B's rounds are numbered apart from A's: runs of two sweeps are never paired


def ratios(pairs: Mapping[str, tuple[Sequence[float], Sequence[float]]]) -> list[Ratio]:
    """B over A for each row (label -> (A's run throughputs, B's)), from one fit of every run of both sides."""
    fit = Fit([Observation(("A", label), i, rate) for label, (a, _) in pairs.items() for i, rate in enumerate(a)]
              + [Observation(("B", label), SIDE_B + i, rate) for label, (_, b) in pairs.items()
                 for i, rate in enumerate(b)])
    found = []
    for label, (a, b) in pairs.items():
        r = fit.ratio(("B", label), ("A", label))
        assert r is not None
        found.append(Ratio(label, r.point, r.lo, r.hi, (len(a), len(b)), fit.judge(r), fit.min_effect))
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
                    for key in common})
    return environment_differences([r for _, r in found_a], [r for _, r in found_b]), found


def _ok_rows(found: Sequence[tuple[Path, RunRecord]]) -> dict[Combination, Row]:
    """A sweep's rows that ran, by their combination (rows of two sweeps match on it, not on the label)."""
    rows, _ = build_rows(found)
    keys = list(dict.fromkeys(Combination.of(r) for _, r in found))  # build_rows' order of rows
    return {key: row for key, row in zip(keys, rows, strict=True) if row.run_rates}


def lines(a: Path, b: Path, env: Sequence[str], found: Sequence[Ratio]) -> list[str]:
    out = [f"A: {a}", f"B: {b}", "What differs between the two sweeps' machines and versions:"]
    out += [f"  {line}" for line in env] or ["  nothing recorded differs"]
    effect = next((r.min_effect for r in found if r.min_effect is not None), None)
    out.append("Per row, B's throughput over A's (geometric means; 95 % interval from the runs, their spread pooled "
               "over both sweeps" + (f"; a difference is claimed beyond {100 * effect:.1f} %" if effect else "") + "):")
    width = max(len(r.label) for r in found)
    for r in found:
        interval = f"[{r.low:.2f}–{r.high:.2f}]" if r.low is not None and r.high is not None else "[no interval]"
        out.append(f"  {r.label:<{width}}  {r.ratio:.2f}× {interval}  runs {r.runs[0]}/{r.runs[1]}  {r.word}")
    return out
