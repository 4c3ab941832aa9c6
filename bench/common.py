"""Shared helpers for the benchmarks in bench/: pinned settings, subprocess runs of `run.py` and of the
bare comparators, a check that nobody else used the CPU during a measurement, statistics, tables, and
the page each script owns in benchmarks/.

Every figure a script prints comes from runs it made itself, on this machine, in this invocation.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the bare comparators import the same model classes as the harness

from harness.core.results import cpu_model  # noqa: E402 (after the path above)

README = REPO / "README.md"  # the main job's command is read from it (bench/main_job.py)
RESULTS_DIR = REPO / "benchmarks"  # one page per benchmark, <name>.md, and the index, README.md


@dataclass(frozen=True)
class Bench:
    """One benchmark: its script `bench/<name>.py` writes `benchmarks/<name>.md`; the index lists them in order."""

    name: str
    title: str
    measures: str
    goal: str


BENCHES = (
    Bench("overhead", "Harness overhead",
          "harness overhead: `run.py strategy=single` vs a bare PyTorch loop", "≥ 0.99"),
    Bench("sampler", "Memory sampler overhead", "memory sampler overhead: off vs 10/100/1000 ms", "default < 0.5 %"),
    Bench("ddp_vs_torchrun", "DDP through the harness vs plain torchrun",
          "DDP through the harness vs plain `torchrun`", "≥ 0.98"),
    Bench("timing_fidelity", "Timing fidelity",
          "timing fidelity: the harness's clock vs whole-process wall time (N vs 2N iterations)", "within 2 %"),
    Bench("report_speed", "Report speed", "report over 1,000 results files", "< 5 s"),
    Bench("scaling", "Scaling on CPU (oversubscription)", "DDP with 1, 2, 4 workers on 2 cores (oversubscription)",
          "reported"),
    Bench("failure_detection", "Failure detection", "a worker's death to the survivors' SIGTERM, per launcher",
          "reported"),
    Bench("hook_cost", "Per-iteration cost of the trainer's calls", "per-iteration cost of the trainer's own calls",
          "reported"),
    Bench("main_job", "The main job from a fresh clone", "the README's main job from a fresh clone", "reported"),
    Bench("profile_cost", "What profiling costs",
          "what `profile=true` costs: steady throughput on/off, the profiled window, start/stop", "on/off ≈ 1"),
    Bench("modern", "Sharding and communication hooks on CPU",
          "ZeRO, FSDP2 and DDP's communication hooks against DDP: throughput, memory against the theory", "reported"),
    Bench("verdicts", "How right the verdicts are",
          "the verdict's rule, old and new on the same simulated sweeps (A/A, power, equivalence, 12 rows), and "
          "its noise model against a real sweep", "A/A false claims ≤ 5 %, power ≥ 80 %, false equivalence ≤ 5 %"),
    Bench("prediction", "How right the predictions are",
          "predicted peak memory and time per iteration against the measured ones, case by case",
          "memory within 10 %, time within 15 %, per case"),
    Bench("projection", "How right the GPU projections are",
          "the GPU operator model against published training results: each case left out, each workload and each "
          "GPU type held out whole; and a preset prediction quiet and loaded",
          "left out: median |error| ≤ 15 %, every case within ±30 %; held out: median ≤ 15 %, every case ≤ 35 %, "
          "band holds ≥ 80 %; loaded within 10 %"),
    Bench("prediction_llm", "How right the predictions are for a language model",
          "bench/prediction.py's cases on a GPT-shaped model, activation checkpointing off and on",
          "memory within 10 %, time within 15 %, per case (`--fresh 3`: the medians of three fresh processes)"),
    Bench("search", "How good the search is",
          "`-m search=true` against the exhaustive sweep of the same space: three spaces (a clear winner, a tie at "
          "the top, the largest batch not the fastest), five searches each; what pruning threw away",
          "right in ≥ 4 of 5 per space; ≤ 30 % of the exhaustive wall time"),
    Bench("mutants", "Which test catches each wrong figure",
          "mutants: each wrong-but-plausible version of a reported figure (timing, report, verdict, planner, search, "
          "MFU, tokens/s, J/image, memory, apex's frontend) applied to a copy, the tests that cover it run (slow "
          "ones too)", "every mutant killed"),
    Bench("published_llm", "Language models planned against published runs",
          "every bf16 llm-foundry MPT run on A100 80GB and H100 80GB (and torchtitan's Llama runs) planned by the "
          "planner's own command line: fits or not, tokens/s per GPU; factors fitted with the A100 rows, the H100 "
          "rows held out",
          "every run predicted to fit; tokens/s within 15 % (median ≤ 10 %), the band holding it; torchtitan's "
          "within 20 %"),
    Bench("link_after_compute", "What a call costs where a step makes it",
          "one collective on two gloo workers after a barrier (the planner's link), after 2 and 4 ms of compute, "
          "and back to back", "reported"),
)
INDEX_INTRO = """\
# Benchmarks of the harness itself

Back to the [README](../README.md).

Each benchmark is one command (`bench/<name>.py`), runnable on a CPU-only machine in a few minutes; add
`--write-results` to replace its page here (`benchmarks/<name>.md`) with the figures of that run, `--quick` for a
seconds-long check (what `tests/test_bench.py` runs: `python -m pytest -m bench` for the scripts that start real runs; it
writes nothing here unless `--results-dir` names a folder).
"""
INDEX_METHOD = """\
How every figure is taken: every run is started by the script — `run.py` exactly as a user types it, or
`harness.launch.runner.execute` in a fresh process that composes the config from `conf/` as `run.py` does (to
alternate harness and comparator in one process, which removes process-to-process noise), or the script's
own bare comparator — with `OMP_NUM_THREADS` and `torch.set_num_threads` pinned and printed; ratios compare
only runs of the same round, taken back to back in alternating order. Around every run the script measures
the CPU time other processes used (system busy time minus its own and its children's); a round disturbed by
more than 0.05 cores is measured again (up to 3 times) once the machine has been idle for 5 s, and one kept
anyway is marked `*`. This VM's throughput also drifts by 5–15 % over tens of seconds with nothing else
running (the host), so each table shows medians with min–max, never a single run.
"""


def index_page() -> str:
    """benchmarks/README.md: the benchmarks in order, each with its command and its page."""
    rows = [f"| {n} | {b.measures} | `python bench/{b.name}.py` | {b.goal} | [{b.name}.md]({b.name}.md) |"
            for n, b in enumerate(BENCHES, 1)]
    table = ["| # | measures | command | goal | figures |", "|---|---|---|---|---|", *rows]
    return "\n".join([INDEX_INTRO, *table, "", INDEX_METHOD])


# The CPU-sized workload of conf/ (what `run.py` does by default on a machine without a GPU), spelled out
# so the bare comparators run exactly the same thing.
CPU_WORKLOAD = {"image_size": 32, "batch_size": 32, "num_classes": 10, "lr": 0.01, "momentum": 0.9, "seed": 0}

T = TypeVar("T")


class BenchError(RuntimeError):
    """A run the benchmark depends on failed: the message holds its command and the tail of its output."""


class Refused(BenchError):
    """The harness refused a command line as bad input (exit 2, before any worker started): `reason` is its line."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# ---- the machine and the settings that are pinned ----

def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def torch_version() -> str:
    import torch

    return torch.__version__


def machine() -> dict[str, Any]:
    return {"cpu": cpu_model(), "cores": cores(), "ram_gib": round(psutil.virtual_memory().total / 2**30),
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "torch": torch_version()}


def machine_line() -> str:
    m = machine()
    return (f"{m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, no GPU, {m['os']}, "
            f"Python {m['python']}, torch {m['torch']}")


def harness_commit() -> str:
    """The commit the harness code comes from, and whether it has local changes."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "harness", "strategies",
                                "amp", "conf", "run.py"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" with local changes" if dirty.strip() else "")


def pinned_env(threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every process a benchmark starts: thread pools pinned, output unbuffered."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.update(extra or {})
    return env


def print_settings(title: str, settings: dict[str, Any]) -> None:
    print(f"== {title} ==", flush=True)
    print(f"machine: {machine_line()}", flush=True)
    for key, value in settings.items():
        print(f"  {key}: {value}", flush=True)


def settings_line(settings: dict[str, Any]) -> str:
    return "; ".join(f"{k} {v}" for k, v in settings.items())


# ---- other people's CPU use: measured around every run, waited out before every round ----

def _busy_seconds() -> tuple[float, float]:
    """CPU seconds the whole machine spent busy, and seconds stolen by the hypervisor, since boot."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    return busy, getattr(t, "steal", 0.0)


def _own_seconds() -> float:
    """CPU seconds of this process and of every child (and their children) it has waited for."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass
class Load:
    """What else ran while we measured: `background` cores busy on average with work that is not ours
    (other users' processes), and `steal` cores taken by the hypervisor. Set when the block exits."""

    wall_s: float = 0.0
    background: float = 0.0
    steal: float = 0.0


@contextmanager
def measure_load() -> Iterator[Load]:
    """Our own CPU time is the larger of two counts that each miss some: the processes we waited for
    (rusage), and the process tree read every 0.2 s (harness.launch.machine_load), which also sees the
    workers a fork server started for run.py (their time never reaches our rusage: nobody waits for them)."""
    from harness.launch.machine_load import LoadReadings

    load = Load()
    tree = LoadReadings(os.getpid(), 0.2).start()
    t0, (busy0, steal0), own0 = time.perf_counter(), _busy_seconds(), _own_seconds()
    try:
        yield load
    finally:
        wall = max(time.perf_counter() - t0, 1e-9)
        busy1, steal1 = _busy_seconds()
        tree.stop()
        load.wall_s = wall
        own = max(_own_seconds() - own0, tree.readings[-1][2] - tree.readings[0][2])
        # /proc/stat counts in clock ticks: allow two ticks per core of reading error
        slack = 2 * psutil.cpu_count() / os.sysconf("SC_CLK_TCK")
        load.background = max(0.0, (busy1 - busy0) - own - slack) / wall
        load.steal = max(0.0, steal1 - steal0) / wall


def wait_for_quiet(max_wait_s: float, threshold: float, sample_s: float = 0.5, quiet_s: float = 5.0) -> float:
    """Wait until the machine has been idle (busy < threshold cores) for `quiet_s` in a row (a pause between
    someone's commands is shorter), at most `max_wait_s`; return the seconds waited."""
    start = time.perf_counter()
    quiet, needed = 0, max(1, round(quiet_s / sample_s))
    while time.perf_counter() - start < max_wait_s and quiet < needed:
        with measure_load() as load:
            time.sleep(sample_s)
        quiet = quiet + 1 if load.background < threshold else 0
    return time.perf_counter() - start


@dataclass
class Round:
    """One round of measurements taken back to back, and the background load seen during each."""

    results: list[Any]
    background: list[float]
    attempts: int
    clean: bool

    @property
    def worst_background(self) -> float:
        return max(self.background, default=0.0)


@dataclass
class Guard:
    """How hard to try for an undisturbed measurement (see `add_common_args`)."""

    max_background: float = 0.05
    retries: int = 3
    quiet_wait_s: float = 120.0
    rounds: list[Round] = field(default_factory=list)

    def round(self, tasks: Sequence[Callable[[], Any]], label: str = "") -> Round:
        """Run `tasks` back to back; if anyone else used the CPU meanwhile, wait and run them all again
        (up to `retries` times), keeping the least disturbed attempt."""
        best: Round | None = None
        for attempt in range(1, self.retries + 2):
            waited = wait_for_quiet(self.quiet_wait_s, self.max_background) if self.quiet_wait_s > 0 else 0.0
            if waited > 6:
                print(f"  (waited {waited:.0f} s for the machine to be idle for 5 s)", flush=True)
            results, loads = [], []
            for task in tasks:
                with measure_load() as load:
                    results.append(task())
                loads.append(load.background)
            current = Round(results, loads, attempt, clean=max(loads) <= self.max_background)
            if best is None or current.worst_background < best.worst_background:
                best = current
            if current.clean:
                break
            print(f"  {label} attempt {attempt}: other processes used {max(loads):.2f} cores meanwhile; "
                  + ("measuring again" if attempt <= self.retries else "keeping the least disturbed attempt"),
                  flush=True)
        assert best is not None
        best.attempts = attempt
        self.rounds.append(best)
        return best

    def absorb(self, rounds: Sequence[dict[str, Any]]) -> None:
        """Rounds a worker process measured under its own Guard (see `round_record`)."""
        for r in rounds:
            self.rounds.append(Round([], [r["worst"]], r["attempts"], r["clean"]))

    @staticmethod
    def round_record(done: Round) -> dict[str, Any]:
        return {"worst": done.worst_background, "attempts": done.attempts, "clean": done.clean}

    def summary(self) -> str:
        if not self.rounds:
            return "no rounds"
        worst = max(r.worst_background for r in self.rounds)
        dirty = sum(not r.clean for r in self.rounds)
        redone = sum(r.attempts - 1 for r in self.rounds)
        text = (f"Background load (other processes) at most {worst:.3f} cores during any kept measurement; "
                f"{redone} round(s) re-measured because of it")
        if dirty:
            text += f"; {dirty} round(s) kept although disturbed (above {self.max_background} cores): marked *"
        return text


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny settings: checks the script runs (seconds)")
    parser.add_argument("--write-results", action="store_true",
                        help="replace this benchmark's page benchmarks/<name>.md with the figures of this run")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="the folder --write-results writes to (default: the repo's benchmarks/; "
                             "with --quick it must be given, so a quick check never writes into the repo)")
    parser.add_argument("--runs-dir", type=Path, default=None,
                        help="keep the runs' folders here (default: a temporary folder, removed at the end)")
    parser.add_argument("--max-background", type=float, default=0.05,
                        help="re-measure a round when other processes used more than this many cores (default 0.05)")
    parser.add_argument("--retries", type=int, default=3, help="re-measurements per disturbed round (default 3)")
    parser.add_argument("--quiet-wait", type=float, default=None,
                        help="seconds to wait for an idle machine before each round (default 120, 0 with --quick)")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The script's arguments and the common ones; `results_dir` resolved. A --quick run's figures are no
    results: --quick --write-results is refused unless --results-dir names where they go."""
    add_common_args(parser)
    args = parser.parse_args(argv)
    if args.quick and args.write_results and args.results_dir is None:
        parser.error("--quick --write-results would put a quick check's figures in benchmarks/: "
                     "give --results-dir")
    if args.results_dir is None:
        args.results_dir = RESULTS_DIR
    return args


def guard_from(args: argparse.Namespace) -> Guard:
    quiet = args.quiet_wait if args.quiet_wait is not None else (0.0 if args.quick else 120.0)
    return Guard(max_background=args.max_background, retries=0 if args.quick else args.retries, quiet_wait_s=quiet)


@contextmanager
def runs_dir(args: argparse.Namespace, name: str) -> Iterator[Path]:
    if args.runs_dir is not None:
        path = args.runs_dir / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        yield Path(tmp)


# ---- processes ----

@dataclass
class Proc:
    cmd: list[str]
    returncode: int
    launched_at: float  # time.time() just before the process was started
    wall_s: float  # start to exit, by this process's clock
    lines: list[tuple[float, str]]  # (time.perf_counter() when the line arrived here, the line)

    @property
    def output(self) -> str:
        return "\n".join(text for _, text in self.lines)

    def tail(self, n: int = 40) -> str:
        return "\n".join(text for _, text in self.lines[-n:])


def run_command(cmd: Sequence[str], env: dict[str, str], cwd: Path = REPO, timeout_s: float = 900,
                echo: str | None = None) -> Proc:
    """Run `cmd`, stamping each output line with this process's clock as it arrives (stderr merged);
    lines starting with `echo` are shown as they come."""
    cmd = [str(c) for c in cmd]
    launched_at, t0 = time.time(), time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    killer = threading.Timer(timeout_s, proc.kill)
    killer.start()
    lines: list[tuple[float, str]] = []
    try:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            lines.append((time.perf_counter(), raw.decode(errors="replace").rstrip("\n")))
            if echo is not None and lines[-1][1].startswith(echo):
                print(lines[-1][1], flush=True)
        returncode = proc.wait()
    finally:
        killer.cancel()
    return Proc(cmd, returncode, launched_at, time.perf_counter() - t0, lines)


def python() -> str:
    return sys.executable


def sweep(overrides: Sequence[str], folder: Path, timeout_s: float = 900) -> Path:
    """`run.py -m OVERRIDES` into `folder`, as a user types it (threads pinned); BenchError when it fails."""
    proc = run_command([python(), "run.py", "-m", *overrides, f"hydra.sweep.dir={folder}"], pinned_env(cores()),
                       timeout_s=timeout_s)
    if proc.returncode == 2:  # bad input: its one line, "error: ..."
        reason = next((text for _, text in reversed(proc.lines) if text.startswith("error:")), proc.tail(1))
        raise Refused(f"run.py -m {' '.join(overrides)} refused: {reason}", reason.removeprefix("error:").strip())
    if proc.returncode != 0:
        raise BenchError(f"run.py -m {' '.join(overrides)} exited {proc.returncode}\n{proc.tail()}")
    return folder


@dataclass
class HarnessRun:
    results: dict[str, Any]
    proc: Proc
    run_dir: Path

    @property
    def throughput(self) -> float:
        return float(self.results["throughput_img_s"])

    def first_iteration_at(self) -> float:
        """time.time() at which the last rank began its first iteration (the ranks' own records)."""
        firsts = [json.loads(p.read_text())["first_iter_time"] for p in (self.run_dir / "ranks").glob("rank*.json")]
        return max(firsts)


def run_harness(overrides: Sequence[str], run_dir: Path, env: dict[str, str], timeout_s: float = 900) -> HarnessRun:
    """`python run.py OVERRIDES hydra.run.dir=RUN_DIR`, as a user types it; fails loudly unless status ok.
    A round measured again gets fresh folders (RUN_DIR-2, -3, ...): the harness never overwrites a run."""
    run_dir = fresh(run_dir)
    proc = run_command([python(), REPO / "run.py", *overrides, f"hydra.run.dir={run_dir}"], env,
                       timeout_s=timeout_s)
    path = run_dir / "results.json"
    if proc.returncode != 0 or not path.exists():
        raise BenchError(f"run.py {' '.join(overrides)} exited {proc.returncode}\n{proc.tail()}")
    results = json.loads(path.read_text())
    if results.get("status") != "ok" or not results.get("throughput_img_s"):
        raise BenchError(f"run.py {' '.join(overrides)}: status {results.get('status')}: {results.get('error')}")
    return HarnessRun(results, proc, run_dir)


def fresh(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def run_json(cmd: Sequence[str], out: Path, env: dict[str, str], timeout_s: float = 900,
             echo: str | None = None) -> tuple[dict[str, Any], Proc]:
    """Run a comparator that writes its measurements to `out` as JSON."""
    out.unlink(missing_ok=True)
    proc = run_command(cmd, env, timeout_s=timeout_s, echo=echo)
    if proc.returncode != 0 or not out.exists():
        raise BenchError(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n{proc.tail()}")
    return json.loads(out.read_text()), proc


# ---- the harness inside this process (what `run.py strategy=single` does after Hydra has composed) ----

def compose_config(overrides: Sequence[str]) -> Any:
    """What `run.py OVERRIDES` hands the runner (harness.compose.Composed: the resolved config and the
    strategy's name), composed from the same conf/."""
    from harness.compose import compose_one, hydra_context

    with hydra_context():
        return compose_one(list(overrides))


def execute_in_process(composed: Any, run_dir: Path) -> dict[str, Any]:
    """harness.launch.runner.execute, as run.py's task calls it for one run (its log lines go nowhere here)."""
    from harness.launch.decide import plan_from_dict
    from harness.launch.runner import execute

    results = execute(plan_from_dict(composed.config, composed.strategy_name, in_sweep=False), fresh(run_dir),
                      in_sweep=False, overrides=list(composed.overrides)).to_dict()
    if results.get("status") != "ok" or not results.get("throughput_img_s"):
        raise BenchError(f"harness run {' '.join(composed.overrides)}: status {results.get('status')}: "
                         f"{results.get('error')}")
    return results


def guard_to_dict(guard: Guard) -> dict[str, float]:
    return {"max_background": guard.max_background, "retries": guard.retries, "quiet_wait_s": guard.quiet_wait_s}


# ---- statistics: the same definitions the harness documents, recomputed here ----

def steady_throughput(window_seconds: Sequence[float], images_per_window: int, warmup_windows: int) -> float:
    steady = list(window_seconds[warmup_windows:])
    return images_per_window * len(steady) / sum(steady)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def spread(values: Sequence[float]) -> tuple[float, float]:
    return min(values), max(values)


def cv_percent(values: Sequence[float]) -> float:
    return 100 * statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else float("nan")


def fmt_spread(values: Sequence[float], digits: int = 3) -> str:
    """median (min–max)"""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    lo, hi = spread(values)
    return f"{median(values):.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def verdict(met: bool) -> str:
    return "**met**" if met else "**missed**"


# ---- output: a table on the terminal, the same table on the benchmark's page ----

@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def print(self) -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table as RichTable

        print(f"== {self.title} ==", flush=True)  # plain, so a pipe or a test sees the header whole
        table = RichTable(title=None)
        for column in self.columns:
            table.add_column(escape(column), justify="left" if column == self.columns[0] else "right")
        for row in self.rows:
            table.add_row(*[escape(c) for c in row])
        Console(width=None if sys.stdout.isatty() else 200).print(table)

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.columns) + " |",
                 "|" + "|".join(":---" if i == 0 else "---:" for i in range(len(self.columns))) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in self.rows]
        return "\n".join(lines)


def bench(name: str) -> Bench:
    for b in BENCHES:
        if b.name == name:
            return b
    raise BenchError(f"no benchmark named {name!r} in BENCHES (known: {', '.join(b.name for b in BENCHES)})")


def results_page(name: str, settings: dict[str, Any], tables: Sequence[Table], lines: Sequence[str],
                 command: str | None = None) -> str:
    """The Markdown page of one benchmark's figures: heading, the command (by default the script's with
    --write-results alone), machine and commit, settings, tables."""
    b = bench(name)
    number = BENCHES.index(b) + 1
    stamp = _dt.date.today().isoformat()
    parts = [f"# {number}. {b.title}", "",
             f"`{command or f'python bench/{name}.py --write-results'}` — measured {stamp} on {machine_line()}; harness at commit "
             f"{harness_commit()}.", "",
             f"Pinned: {settings_line(settings)}.", ""]
    for table in tables:
        parts += [f"*{table.title}*", "", table.markdown(), ""]
    parts += list(lines)
    return "\n".join(parts).rstrip() + "\n"


def write_results(name: str, body: str, folder: Path = RESULTS_DIR) -> None:
    """Write `folder/<name>.md` (this benchmark's page) and the index `folder/README.md`; no other file is
    touched, and a file whose text would not change is not written at all."""
    bench(name)  # an unknown name would be a page the index does not list: refused before writing anything
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in ((folder / f"{name}.md", body.strip() + "\n"), (folder / "README.md", index_page())):
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    print(f"results: wrote {folder / f'{name}.md'}", flush=True)
