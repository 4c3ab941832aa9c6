"""How right the harness's verdicts are: sweeps whose truth is known by construction, each a fresh
`run.py -m` exactly as a user types it (rounds and racing as by default), judged by the verdict it prints.

    python bench/verdicts.py [--sweeps N] [--write-results]

(a) A/A: one combination under two labels that cannot change its speed (`seed=0,1`): how often a difference is
    claimed (a winner named, or a row clearly slower). Goal <= 5 %.
(b) A known difference: `data.image_size=32,45` (twice the pixels): how often the verdict finds the 32 px row
    faster, in the right direction. Goal >= 95 %.
(c) Identical default sweeps (`run.py -m`, three of them): no pair of rows judged faster one way in one sweep
    and the other way in another.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import common

from harness.report.rows import build_rows, find_results, row_fit  # noqa: E402  (after common set sys.path)


def judgements(folder: Path) -> dict[tuple[str, str], str]:
    """Every ordered pair of timed rows: faster, slower, same or undecided, as the report judges them."""
    rows, _ = build_rows(find_results([folder])[0])
    fit = row_fit(rows)
    timed = [r.label for r in rows if r.throughput and not r.busy]
    return {(a, b): fit.judge(fit.ratio(a, b)) for a, b in itertools.permutations(timed, 2)}


def claims_a_difference(folder: Path) -> bool:
    return any(word in ("faster", "slower") for word in judgements(folder).values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweeps", type=int, default=12, help="A/A and known-difference sweeps each (default 12)")
    parser.add_argument("--identical", type=int, default=3, help="identical default sweeps (default 3)")
    args = common.parse_args(parser, argv)
    small = ["strategy=single", "amp=O0"]
    if args.quick:  # seconds: the tiny model, one sweep of each kind, no default sweep
        small += ["model=tiny_cnn", "batch_size=8", "iterations=40", "timing.budget_s=5"]
        args.sweeps, args.identical = 1, 0
    settings = {"A/A": f"{' '.join(small)} seed=0,1 ({args.sweeps} sweeps)",
                "known": f"{' '.join(small)} data.image_size=32,45 ({args.sweeps} sweeps)",
                "identical": f"run.py -m ({args.identical} sweeps)", "cores": common.cores(),
                "OMP_NUM_THREADS": "pinned to the cores (common.pinned_env)"}
    common.print_settings("The verdicts against sweeps whose truth is known", settings)
    table = common.Table("verdicts against known truths", ["case", "sweeps", "verdicts", "goal", "measured"])
    started = time.perf_counter()
    with common.runs_dir(args, "verdicts") as runs, common.measure_load() as load:
        aa = [claims_a_difference(common.sweep([*small, "seed=0,1"], runs / f"aa-{i}")) for i in range(args.sweeps)]
        print(f"  A/A: {sum(aa)} of {len(aa)} sweeps claimed a difference", flush=True)
        found = []
        for i in range(args.sweeps):
            said = judgements(common.sweep([*small, "data.image_size=32,45"], runs / f"known-{i}"))
            right = [v for (a, b), v in said.items() if "px=32" in a and "px=45" in b]
            found.append(right == ["faster"])
        print(f"  known: the 32 px row found faster in {sum(found)} of {len(found)} sweeps", flush=True)
        verdicts = [judgements(common.sweep([], runs / f"default-{i}")) for i in range(args.identical)]
    contradictions = sorted({(a, b) for one, other in itertools.permutations(verdicts, 2)
                             for (a, b), word in one.items() if word == "faster" and other.get((a, b)) == "slower"})
    claimed = [sum(v == "faster" for v in one.values()) for one in verdicts]
    table.add("(a) A/A: a difference claimed", len(aa), sum(aa), "≤ 5 %", f"{100 * sum(aa) / max(1, len(aa)):.0f} %")
    table.add("(b) twice the pixels: found, right way", len(found), sum(found), "≥ 95 %",
              f"{100 * sum(found) / max(1, len(found)):.0f} %")
    table.add("(c) identical default sweeps: contradictions", len(verdicts), len(contradictions), "0",
              f"{len(contradictions)} (pairs judged faster: {', '.join(map(str, claimed)) or 'none'})")
    table.print()
    took = time.perf_counter() - started
    print(f"took {took:.0f} s; background load {load.background:.2f} cores", flush=True)
    if contradictions:
        print("contradictions: " + "; ".join(f"{a} vs {b}" for a, b in contradictions), flush=True)
    if args.write_results:
        lines = [f"- {len(aa) + len(found) + len(verdicts)} sweeps in {took / 60:.0f} min; background load "
                 f"{load.background:.2f} cores.",
                 "- A claim is any pair of rows judged faster or slower (interval excluding 1 and beyond the "
                 "sweep's minimum effect: docs/verdict.md); 'found' means the 32 px row judged faster than "
                 "the 45 px row, and nothing else."]
        common.write_results("verdicts", common.results_page("verdicts", settings, [table], lines),
                             args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
