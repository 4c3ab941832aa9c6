"""The README's main job as a new user meets it: a fresh clone, the README's first command, timed.

    python bench/main_job.py [--write-results]

Clones this repository's HEAD into a temporary folder, reads the main-job command from the README (the
indented line after "Run the main job"), and runs its `&&`-separated parts one after another in the clone
with bash, timing each from outside: making the venv, installing (torch from this machine's disk, the rest
from the package index), and the sweep itself. The sweep's report is checked to exist and its rows counted.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common


def main_job_command(readme: str) -> str:
    after = readme[readme.index("**Run the main job**"):]
    return next(line.strip() for line in after.splitlines()[1:] if line.startswith("    "))


PHASES = ("prepare", "process_start", "imports", "process_group", "build", "to_first_iteration", "windows",
          "after_loop", "teardown", "results")  # harness.core.results.PHASES, in the order a run goes through them


def time_split(sweep: Path, sweep_s: float) -> tuple[common.Table, list[str]]:
    """Where the sweep's time went: each phase of every run that ran (results.json's `phases`), summed over
    the runs, and what lies outside the runs (Python and Hydra starting, composing each job, the report)."""
    runs = [json.loads(p.read_text()) for p in sweep.rglob("results.json")]
    timed = [r for r in runs if r.get("phases")]
    walls = [r["finished_at"] - r["started_at"] for r in runs if r.get("finished_at") and r.get("started_at")]
    table = common.Table(f"where the sweep's {sweep_s:.0f} s went ({len(timed)} runs that trained, "
                         f"{len(runs) - len(timed)} that did not)", ["part", "seconds in all", "per run (median)"])
    for phase in PHASES:
        values = [r["phases"][phase] for r in timed if phase in r["phases"]]
        if values:
            table.add(phase, f"{sum(values):.1f}", f"{statistics.median(values):.2f}")
    inside = sum(walls)
    table.add("inside the runs (launcher start to results)", f"{inside:.1f}", "")
    table.add("outside the runs (python and Hydra start, each job's config, the report)", f"{sweep_s - inside:.1f}",
              f"{(sweep_s - inside) / max(1, len(runs)):.2f}")
    rounds = max((r.get("round") or 1 for r in runs), default=0)
    windows = sum(r["phases"].get("windows", 0.0) for r in timed)
    lines = [f"{len(runs)} runs in {rounds} rounds; {windows:.0f} s of the sweep's {sweep_s:.0f} s were the timed "
             f"loops ({100 * windows / sweep_s:.0f} %), {(sweep_s - windows) / max(1, len(timed)):.2f} s per run "
             "trained went elsewhere"]
    return table, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = common.parse_args(parser, argv)
    command = main_job_command(common.README.read_text())
    parts = [p.strip() for p in command.split("&&")]
    if args.quick:  # the same steps on the tiniest sweep, reusing this venv instead of installing
        parts = [f"{sys.executable} run.py -m strategy=single amp=O0 model=tiny_cnn data.image_size=8 batch_size=8 "
                 "iterations=40"]
    settings = {"command": command, "clone of": common.harness_commit(), "cores": common.cores(),
                "OMP_NUM_THREADS": "not set (the command as a user types it)"}
    common.print_settings("The README's main job from a fresh clone", settings)
    table = common.Table("the main job from a fresh clone (wall seconds, timed from outside)", ["step", "seconds"])
    with tempfile.TemporaryDirectory(prefix="bench-main-job-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "--quiet", str(common.REPO), str(clone)], check=True)
        total = 0.0
        with common.measure_load() as load:
            for part in parts:
                started = time.perf_counter()
                proc = subprocess.run(["bash", "-c", part], cwd=clone, capture_output=True, text=True)
                took = time.perf_counter() - started
                if proc.returncode != 0:
                    raise common.BenchError(f"{part} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
                total += took
                table.add(re.sub(r"\s+", " ", part)[:90], f"{took:.0f}")
                print(f"  {took:7.1f} s  {part}", flush=True)
        reports = list((clone / "runs" / "multirun").glob("*/report.json"))
        if len(reports) != 1:
            raise common.BenchError(f"expected one sweep report, found {reports}")
        rows = json.loads(reports[0].read_text())["rows"]
        statuses = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
        split, split_lines = time_split(reports[0].parent, took)
        verdict = next((line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "Verdict:" in line),
                       "(no verdict line)")
    table.add("total", f"{total:.0f}")
    table.print()
    split.print()
    print("\n".join(split_lines), flush=True)
    sweep = took
    print(f"main job: {total:.0f} s in all, the sweep {sweep:.0f} s; rows {statuses}; background load "
          f"{load.background:.2f} cores", flush=True)
    if args.write_results:
        minutes = f"{int(total // 60)} min {int(total % 60)} s"
        lines = [f"- From a fresh clone, the README's main-job command took {minutes} in all, of which the sweep "
                 f"(`run.py -m`) took {int(sweep // 60)} min {int(sweep % 60)} s; its report has "
                 + ", ".join(f"{n} {s}" for s, n in statuses.items()) + " rows.",
                 f"- Background load (other processes) during the run: {load.background:.2f} cores.",
                 *[f"- {line}" for line in split_lines], f"- The sweep's verdict: {verdict.partition('Verdict: ')[2]}"]
        body = common.results_page("main_job", settings, [table, split], lines)
        common.write_results("main_job", body, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
