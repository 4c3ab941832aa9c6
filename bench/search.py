"""How good the search is (`run.py -m search=true`, docs/search.md): over spaces whose exhaustive answer this script
measures itself, is the configuration a search finds the fastest one, and what does the search cost beside it?

    python bench/search.py [--searches N] [--rounds R] [--budget S] [--write-results]

For each space (three, each made so that its truth is of a known kind):
1. the exhaustive sweep: every combination, `repeat=R` rounds of fresh processes (`run.py -m ... repeat=R`);
   its truth is the report's own standing of the rows (harness.verdict.racing.standing): the leader, and the
   rows it calls equivalent within verdict.margin;
2. N searches of the same space (`run.py -m ... search=true search.budget_s=S`), one after the other, half of
   them before the exhaustive sweep and the rest after it (see `ordered`).
A search is right when its answer is the exhaustive leader, one the exhaustive sweep calls equivalent to it, or
one whose exhaustive throughput is within verdict.margin of the leader's, or (known by construction) the leader's
own run under a label the run never reads (the tie space's dist.timeout_s). Its cost is its whole command's wall
time (predictions, runs and report) over the exhaustive command's. Every combination a search pruned is looked
up in the exhaustive sweep: its predicted time per iteration against the measured one, and whether it was the
exhaustive leader (pruning that threw the winner away).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import common

from harness.report.findings import compute  # noqa: E402  (after common set sys.path)

COMMON = ("model=tiny_cnn", "strategy=single", "amp=O0")


@dataclass(frozen=True)
class Space:
    name: str
    kind: str  # what makes its truth known
    overrides: tuple[str, ...]
    labels: tuple[str, ...] = ()  # swept keys the run never reads: combinations differing only there are one run
    judged: bool = True  # one of the three kinds, held to its goals; else shown for what it tells

    @property
    def keys(self) -> list[str]:
        """The swept keys: what tells one combination from another."""
        return [o.partition("=")[0] for o in self.overrides if "," in o]

    def run_of(self, name: str) -> str:
        """The run a combination is, its labels left out: `grad_accum=1 dist.timeout_s=61` -> `grad_accum=1`."""
        return " ".join(part for part in name.split() if part.partition("=")[0] not in self.labels)


# Runs as long as a user's: 200 iterations (9 timed windows), so that a run is not mostly its process's start-up and
# the comparison of costs is not one of fixed costs alone (a search pays its start-up, predictions and report once,
# 16-22 s here, as the exhaustive sweep does; at 100 iterations "batch"'s searches took 29-33 % of its exhaustive
# sweep's time). A micro-batch axis halves the global batch down to 2 samples a micro-step, as a grid over
# micro-batch sizes would (clear: 64 to 2; flat: 128 to 2); tie's is shorter, its pair of labels doubling it. "batch" takes every third halving (128, 16 and 2
# samples a micro-batch): between neighbouring halvings the time of a step differs by less than this VM's 15-30 %
# between fresh processes (see "flat"), so that a space of them has no truth 8 rounds can know to 5 %.
BATCH = "128 samples of 64 pixels a step"
MMAP = ("in one micro-batch a layer's activations (34 MB) pass glibc's largest reused allocation (32 MiB), so every "
        "step maps them afresh: 1.4-2.4x the time of 2 or 4 micro-batches in bare loops here, the same with "
        "MALLOC_MMAP_THRESHOLD_ raised")
SPACES = (
    Space("clear", "a clear winner: at 8-pixel images a micro-step costs mostly the trainer's own per-step work, so "
                   "one step of 64 samples beats 2 to 32 micro-steps by far (the micro-batch axis, halving)",
          ("data.image_size=8", "batch_size=64", "iterations=200", "grad_accum=1,2,4,8,16,32")),
    Space("tie", "a tie at the top by construction: the same run under two labels (dist.timeout_s, which a "
                 "one-process run never reads), beside 4 and 16 micro-steps; either label of the leader's run is right",
          ("data.image_size=8", "batch_size=64", "iterations=200", "grad_accum=1,4,16", "dist.timeout_s=60,61"),
          labels=("dist.timeout_s",)),
    Space("batch", f"the largest micro-batch is not the fastest: {BATCH} in 1, 8 or 64 micro-batches (every third "
                   f"halving); {MMAP}; 64 micro-batches of 2 samples pay the per-micro-step work 64 times",
          ("data.image_size=64", "batch_size=128", "iterations=200", "grad_accum=1,8,64")),
    Space("flat", f"beyond the issue's three: a halving grid's flat top, {BATCH} in 1 to 64 micro-batches; {MMAP}; 2 "
                  "to 16 micro-batches differ by less than this VM's noise between fresh processes",
          ("data.image_size=64", "batch_size=128", "grad_accum=1,2,4,8,16,32,64"), judged=False),
)
QUICK_SPACES = (Space("clear", SPACES[0].kind, ("data.image_size=8", "batch_size=64", "grad_accum=1,16")),)


def candidate(overrides: list[str], keys: list[str]) -> str:
    """A combination by its swept keys' values, e.g. `grad_accum=4 dist.timeout_s=60`."""
    values = dict(o.lstrip("+~").partition("=")[::2] for o in overrides)
    return " ".join(f"{k}={values.get(k, '?')}" for k in keys)


@dataclass
class Truth:
    wall_s: float
    throughput: dict[str, float]  # by candidate: samples/s, geometric mean over the rounds
    s_per_iteration: dict[str, float]
    leader: str
    tied: list[str]
    open: list[str]
    decided: str | None
    margin: float  # verdict.margin, as the exhaustive sweep's report judged its rows
    space: Space

    def why_right(self, pick: str | None) -> str | None:
        """Why a search's answer counts as right, or None: the exhaustive leader; one the exhaustive sweep calls
        equivalent to it; one whose exhaustive throughput is within verdict.margin of the leader's; or the leader's
        own run under another label (truth known by construction, whatever 8 rounds of noise measured)."""
        if pick is None:
            return None
        if pick == self.leader:
            return "the leader"
        if pick in self.tied:
            return "equivalent"
        if self.throughput.get(pick, 0.0) >= (1 - self.margin) * self.throughput[self.leader]:
            return "within the margin"
        if self.space.run_of(pick) == self.space.run_of(self.leader):
            return "the leader's run"
        return None

    def right(self, pick: str | None) -> bool:
        return self.why_right(pick) is not None

    def in_top(self, pick: str | None) -> bool:
        """The answer is one the exhaustive sweep did not tell from its leader (leader, equivalent or not separated):
        a looser reading than `right`, shown beside it, never counted for the goal."""
        return pick is not None and (pick == self.leader or pick in self.tied or pick in self.open)


@dataclass
class Search:
    wall_s: float
    pick: str | None
    decided: str | None
    runs: int
    rounds: int
    ended_by: str
    kept: list[str]
    pruned: dict[str, float | None] = field(default_factory=dict)  # candidate -> predicted s/iteration
    predicted: dict[str, float] = field(default_factory=dict)


WALL = "bench-wall.json"  # in each sweep's folder: the command's wall time, so a page can be made again (--from-runs)


def sweep(overrides: list[str], folder: Path) -> None:
    """`run.py -m OVERRIDES` into `folder`, its wall time kept there."""
    proc = common.run_command([common.python(), "run.py", "-m", *overrides, f"hydra.sweep.dir={folder}"],
                              common.pinned_env(common.cores()), timeout_s=3600)
    if proc.returncode != 0:
        raise common.BenchError(f"run.py -m {' '.join(overrides)} exited {proc.returncode}\n{proc.tail()}")
    (folder / WALL).write_text(json.dumps({"wall_s": proc.wall_s, "command": overrides}))


def wall_of(folder: Path) -> float:
    return float(json.loads((folder / WALL).read_text())["wall_s"])


def exhaustive(space: Space, folder: Path) -> Truth:
    """The exhaustive sweep's truth, from its folder."""
    report = compute([folder])
    state, margin = report.decision.standing, report.decision.margin
    if state is None or margin is None:
        raise common.BenchError(f"the exhaustive sweep of {space.name} was not judged ({folder})")
    by_label = {r.label: candidate(list(r.overrides), space.keys) for r in report.rows}
    throughput = {by_label[r.label]: r.throughput for r in report.rows if r.throughput}
    per_iteration = {by_label[r.label]: r.global_batch / r.throughput for r in report.rows
                     if r.throughput and r.global_batch}
    if state.leader is None:
        raise common.BenchError(f"the exhaustive sweep of {space.name} measured nothing ({folder})")
    return Truth(wall_of(folder), throughput, per_iteration, by_label[str(state.leader)],
                 [by_label[str(k)] for k in state.tied], [by_label[str(k)] for k in state.open], state.decided, margin, space)


def search(space: Space, folder: Path) -> Search:
    """One search's answer and cost, from its folder."""
    report = json.loads((folder / "report.json").read_text())
    record = json.loads((folder / "search.json").read_text())
    labels = {r["label"]: candidate(r["overrides"], space.keys) for r in report["rows"]}
    answer = report["search"] or {}
    named = {**dict(zip(record["kept_names"], record["kept"], strict=True)),
             **{p["name"]: p["overrides"] for p in record["pruned"]}}
    return Search(wall_of(folder), labels.get(answer.get("best") or ""), answer.get("decided"), record["runs"],
                  record["rounds"], record["ended_by"], [candidate(k, space.keys) for k in record["kept"]],
                  {candidate(p["overrides"], space.keys): p["predicted_s_per_iteration"] for p in record["pruned"]},
                  {candidate(named[name], space.keys): s for name, s in record["predicted_s_per_iteration"].items()
                   if name in named})


def ordered(space: str, searches: int, search_cmd: list[str], exhaustive_cmd: list[str]
            ) -> list[tuple[str, list[str]]]:
    """The space's sweeps in the order they run, each with its folder's name: the exhaustive sweep in the middle
    of the searches (2 before it and 3 after, of 5), so that a drift of this VM's speed over the half hour a space
    takes weighs on both sides of the cost ratio alike (run after it, 5 searches of "batch" found the machine up to
    a quarter slower than the exhaustive sweep had)."""
    runs = [(f"{space}-search{i}", search_cmd) for i in range(searches)]
    return [*runs[:searches // 2], (f"{space}-exhaustive", exhaustive_cmd), *runs[searches // 2:]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--searches", type=int, default=5, help="searches of each space (default 5)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of the exhaustive sweep (default 8)")
    parser.add_argument("--budget", type=float, default=20.0, help="each search's search.budget_s (default 20)")
    parser.add_argument("--space", action="append", choices=[s.name for s in SPACES], default=None,
                        help="only this space (again for more); default: the three held to the goals, not 'flat'")
    parser.add_argument("--from-runs", type=Path, default=None,
                        help="make the page again from a --runs-dir folder of an earlier run (nothing is run)")
    args = common.parse_args(parser, argv)
    spaces = QUICK_SPACES if args.quick else tuple(s for s in SPACES if (s.name in args.space if args.space else s.judged))
    searches, rounds = (1, 1) if args.quick else (args.searches, args.rounds)
    extra = ("iterations=20", "log_every=10") if args.quick else ()
    settings = {"threads": f"OMP_NUM_THREADS={common.cores()}", "common": " ".join(COMMON),
                "exhaustive": f"repeat={rounds}", "search": f"search.budget_s={args.budget:g}",
                "searches per space": searches}
    common.print_settings("searches against the exhaustive sweep", settings)
    outcome: dict[str, tuple[Truth, list[Search]]] = {}
    with common.runs_dir(args, "search") as fresh:
        base = args.from_runs or fresh
        for space in spaces:
            search_cmd = [*COMMON, *space.overrides, *extra, "search=true", f"search.budget_s={args.budget:g}"]
            exhaustive_cmd = [*COMMON, *space.overrides, *extra, f"repeat={rounds}"]
            for name, command in ordered(space.name, searches, search_cmd, exhaustive_cmd):
                if not args.from_runs:
                    if not args.quick:
                        common.wait_for_quiet(30.0, args.max_background)
                    sweep(command, base / name)
                    print(f"[{space.name}] {name} in {wall_of(base / name):.0f} s", flush=True)
            truth = exhaustive(space, base / f"{space.name}-exhaustive")
            print(f"[{space.name}] exhaustive in {truth.wall_s:.0f} s: leader {truth.leader} ({truth.decided}); "
                  f"tied {truth.tied}; open {truth.open}", flush=True)
            found = []
            for i in range(searches):
                found.append(search(space, base / f"{space.name}-search{i}"))
                s = found[-1]
                print(f"[{space.name}] search {i + 1}: {s.pick} ({s.decided}) in {s.wall_s:.0f} s, {s.runs} runs, "
                      f"pruned {sorted(s.pruned)}; right: {truth.why_right(s.pick) or 'no'}", flush=True)
            outcome[space.name] = (truth, found)
    tables, lines = report(spaces, outcome)
    if args.from_runs:
        lines.append(f"- Made again from the folders of an earlier run of this script (`--from-runs`): nothing was run "
                     f"for this page; the wall times are that run's, as it logged them ({WALL} in each folder).")
    for table in tables:
        print(f"\n== {table.title} ==\n{table.markdown()}", flush=True)
    print("\n".join(lines), flush=True)
    if args.write_results:
        common.write_results("search", common.results_page("search", settings, tables, lines), args.results_dir)
    return 0


def report(spaces: tuple[Space, ...], outcome: dict[str, tuple[Truth, list[Search]]]
           ) -> tuple[list[common.Table], list[str]]:
    truths = common.Table("Each space's exhaustive sweep: samples/s per combination (geometric mean over its rounds)",
                          ["space", "combination", "samples/s", "exhaustive says"])
    for space in spaces:
        truth, _ = outcome[space.name]
        for name, rate in sorted(truth.throughput.items(), key=lambda kv: -kv[1]):
            says = "leader" if name == truth.leader else "equivalent" if name in truth.tied else \
                "not separated" if name in truth.open else "slower"
            truths.add(space.name, name, f"{rate:,.0f}", says)
    searched = common.Table("Each search against its space's exhaustive sweep",
                            ["space", "search", "answer", "decided", "right", "runs (rounds)", "ended by",
                             "pruned", "wall s", "of the exhaustive"])
    pruned = common.Table("Every combination a search pruned, against the exhaustive measurement",
                          ["space", "combination", "times pruned", "predicted s/it", "measured s/it",
                           "error (measured - predicted) / measured", "the exhaustive leader?"])
    predictions_table = common.Table("Every combination's prediction (the searches' median) against the exhaustive "
                             "measurement: what pruning judged by; relative to each space's fastest",
                             ["space", "combination", "predicted s/it", "measured s/it", "error",
                              "predicted / fastest predicted", "measured / fastest measured"])
    lines = [f"- **{space.name}**: {space.kind}: `{' '.join(space.overrides)}`" for space in spaces] + [""]
    for space in spaces:
        truth, found = outcome[space.name]
        for i, s in enumerate(found, 1):
            why = truth.why_right(s.pick)
            searched.add(space.name, i, s.pick or "none", s.decided or "undecided", f"yes: {why}" if why else "NO",
                         f"{s.runs} ({s.rounds})", s.ended_by, len(s.pruned), f"{s.wall_s:.0f}",
                         f"{100 * s.wall_s / truth.wall_s:.0f} %")
        counted: dict[str, list[float | None]] = {}
        for s in found:
            for name, seconds in s.pruned.items():
                counted.setdefault(name, []).append(seconds)
        for name, predictions in sorted(counted.items()):
            known = [p for p in predictions if p is not None]
            guess = common.median(known) if known else None
            measured = truth.s_per_iteration.get(name)
            error = f"{100 * (measured - guess) / measured:+.0f} %" if guess and measured else "n/a"
            pruned.add(space.name, name, len(predictions), f"{guess:.4f}" if guess else "n/a",
                       f"{measured:.4f}" if measured else "n/a", error, "YES" if name == truth.leader else "no")
        guesses = {name: common.median([s.predicted[name] for s in found if name in s.predicted])
                   for name in truth.s_per_iteration if any(name in s.predicted for s in found)}
        for name, measured in sorted(truth.s_per_iteration.items(), key=lambda kv: kv[1]):
            guess = guesses.get(name)
            predictions_table.add(space.name, name, f"{guess:.4f}" if guess else "n/a", f"{measured:.4f}",
                          f"{100 * (measured - guess) / measured:+.0f} %" if guess else "n/a",
                          f"{guess / min(guesses.values()):.2f}x" if guess else "n/a",
                          f"{measured / min(truth.s_per_iteration.values()):.2f}x")
        hits = sum(truth.right(s.pick) for s in found)
        by_label = sum(truth.why_right(s.pick) == "the leader's run" for s in found)
        construction = f", {by_label} of them as the leader's run under another label (the exhaustive point " \
            f"estimates alone: {hits - by_label} of {len(found)})" if by_label else ""
        shares = [s.wall_s / truth.wall_s for s in found]
        top = sum(truth.in_top(s.pick) for s in found)
        goals = ("goal: at least 4 of 5; " if space.judged else "no goal, not one of the issue's three spaces; ",
                 " (goal: at most 30 %)" if space.judged else "")
        lines.append(f"- **{space.name}**: right in {hits} of {len(found)} searches{construction} ({goals[0]}within "
                     f"verdict.margin, {100 * truth.margin:.0f} %, of the leader counts); one the exhaustive sweep "
                     f"did not tell from its leader in {top} of {len(found)}; wall time "
                     f"{common.fmt_spread([100 * x for x in shares], 0)} % of the exhaustive sweep's{goals[1]}; the "
                     f"exhaustive leader {truth.leader} ({truth.decided or 'undecided'}).")
    if not pruned.rows:
        lines.append("- No search pruned anything: every candidate was predicted within search.prune_factor (2x, at "
                     "the fast end of its band) of the best prediction; the table of predictions shows by how much.")
    everything = [s.wall_s for _, found in outcome.values() for s in found]
    exhaustive_s = sum(t.wall_s for t, _ in outcome.values())
    if everything and exhaustive_s and all(not math.isnan(x) for x in everything):
        lines.append(f"- All spaces: the searches took {sum(everything) / len(everything):.0f} s on average; the "
                     f"exhaustive sweeps {exhaustive_s / len(outcome):.0f} s.")
    return [truths, searched, pruned, predictions_table], lines


if __name__ == "__main__":
    raise SystemExit(main())
