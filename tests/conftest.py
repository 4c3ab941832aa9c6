"""Shared helpers: the real CLI in a process of its own, cached real runs, tiny configs, amp plugins and rank specs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from harness.core.config import RunConfig

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = REPO / "conf"
CLI_TIMEOUT_S = 120

# A run small enough for 2 CPU cores: a few seconds, most of it process start-up.
TINY = ("model=tiny_cnn", "data.image_size=8", "batch_size=8")
ONE_ROUND = "repeat=1"  # a sweep of one round: what a test of something else needs (racing runs two at least)


# Ranks forked from a server that has imported torch once, instead of each importing it again (a supported launcher
# option: docs/config.md): a two-rank run costs 9 s of CPU instead of 18. The user's default, spawn, is what the tests
# of launching, stopping and killing runs use (quick=False; tests/test_reliability.py, test_launcher.py).
QUICK_START = "launcher.start_method=forkserver"


def quick(overrides: Sequence[str], wanted: bool = True) -> list[str]:
    """The overrides, starting ranks from a fork server unless they choose how ranks start themselves."""
    chosen = any(o.lstrip("+").startswith(("launcher=", "launcher.", "hydra/launcher")) for o in overrides)
    return [*overrides, QUICK_START] if wanted and not chosen else list(overrides)


class Forked:
    """A run RUN_PY started, as much of subprocess.Popen as the tests use: `pid`, `poll`, `wait`, `kill`,
    `returncode`, and (`live`) `stdout` and `stderr` to read as it writes them."""

    def __init__(self, pid: int, argv: list[str], folder: Path, streams: tuple[Any, Any] | None) -> None:
        self.pid, self.argv, self.folder = pid, argv, folder
        self.returncode: int | None = None
        self.stdout, self.stderr = streams or (None, None)

    def poll(self) -> int | None:
        code = self.folder / "code"
        if self.returncode is None and code.exists():
            self.returncode = int(code.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.argv, timeout or 0.0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class RunPy:
    """`python run.py ARGS` from the repository root as the suite starts it: forked from tests/run_py_server.py, an
    interpreter of this worker's that has imported what run.py imports (torch, Hydra, the harness), instead of a
    new interpreter importing them again: 3 s of CPU a run, over the suite's runs three minutes of its two cores.
    The run is run.py as `__main__` with the arguments, folder, environment and CPU affinity a subprocess would
    have had, in a process of its own; what run.py does while it imports (a Ctrl-C then, the first imports' order)
    is checked with new interpreters (LiveRun(..., new_interpreter=True), test_cli.py's refusals)."""

    def __init__(self) -> None:
        self.server: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()

    def start(self, argv: list[str], env: dict[str, str] | None = None, live: bool = False,
              new_session: bool = False, cwd: Path = REPO, out: Path | None = None,
              err: Path | None = None) -> Forked:
        """Started in the background; its output to files (`out`, `err`, or the run's own), or with `live` to
        pipes read as it comes (named pipes, opened here before the run opens them). `new_session`: as Popen's
        start_new_session."""
        import tempfile

        WATCH.note(" ".join(argv))
        folder = Path(tempfile.mkdtemp(prefix="run-py-"))
        streams = None
        if live:
            for name in ("out", "err"):
                os.mkfifo(folder / name)
            fds = [os.open(folder / name, os.O_RDONLY | os.O_NONBLOCK) for name in ("out", "err")]
            for fd in fds:
                os.set_blocking(fd, True)
            streams = tuple(open(fd, encoding="utf-8", errors="replace") for fd in fds)
        request = {"argv": argv, "cwd": str(cwd), "env": dict(os.environ if env is None else env),
                   "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                   "out": str(out or folder / "out"), "err": str(err or folder / "err"),
                   "code": str(folder / "code"), "new_session": new_session}
        with self.lock:
            for _ in range(2):  # a test ending this process's descendants (stops.end_descendants) ends the server
                if self.server is None or self.server.poll() is not None:
                    self.server = subprocess.Popen([sys.executable, str(REPO / "tests" / "run_py_server.py")],
                                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                assert self.server.stdin is not None and self.server.stdout is not None
                try:
                    self.server.stdin.write(json.dumps(request).encode() + b"\n")
                    self.server.stdin.flush()
                    reply = self.server.stdout.readline()
                except BrokenPipeError:
                    reply = b""
                if reply:
                    return Forked(json.loads(reply)["pid"], argv, folder, streams)
                self.server.wait(10)
        raise RuntimeError(f"tests/run_py_server.py ended twice without starting {' '.join(argv)}")

    def run(self, argv: list[str], timeout: float, env: dict[str, str] | None = None,
            cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
        """As `subprocess.run([python, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)`:
        raises subprocess.TimeoutExpired after killing the run."""
        forked = self.start(argv, env, cwd=cwd)

        def output(name: str) -> str:
            return (forked.folder / name).read_text(errors="replace")

        try:
            code = forked.wait(timeout)
        except subprocess.TimeoutExpired:
            forked.kill()
            expired = subprocess.TimeoutExpired(argv, timeout, output("out"), output("err"))
            shutil.rmtree(forked.folder, ignore_errors=True)
            raise expired from None
        done = subprocess.CompletedProcess([sys.executable, *argv], code, output("out"), output("err"))
        shutil.rmtree(forked.folder, ignore_errors=True)
        return done

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.stdin.close()  # type: ignore[union-attr]
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()


RUN_PY = RunPy()


def run_cli(*overrides: str, tmp_path: Path, timeout: float = CLI_TIMEOUT_S, quick_start: bool = True,
            env: dict[str, str] | None = None,
            one_core: bool = False) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """`python run.py OVERRIDES hydra.run.dir=<tmp_path>/run` from the repository root (through RUN_PY; ranks from a
    fork server unless `quick_start` is false: QUICK_START; on one core with `one_core`: one_core_of_this_worker).

    Returns the finished process and the parsed results.json (plus `_run_dir`, the folder, for the tests),
    or None when no results file was written.
    """
    run_dir = tmp_path / "run"
    with one_core_of_this_worker() if one_core else contextlib.nullcontext():
        proc = RUN_PY.run(["run.py", *quick(overrides, quick_start), f"hydra.run.dir={run_dir}"], timeout, env)
    path = run_dir / "results.json"
    results = {**json.loads(path.read_text()), "_run_dir": str(run_dir)} if path.exists() else None
    return proc, results


def describe(proc: subprocess.CompletedProcess[str]) -> str:
    """What to print when a CLI assertion fails."""
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


def refused_before_start(overrides: Sequence[str], monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The pre-flight check's answer to a command line it must refuse: exit 2 and its stderr lines, with nothing
    started (a launch, the fork server or a run would fail the test)."""
    from harness import cli

    def launched(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("nothing starts for a refused run")

    for entry in ("harness.launch.launcher.launch_workers", "harness.launch.launcher.preload_forkserver",
                  "harness.launch.runner.execute"):
        monkeypatch.setattr(entry, launched)
    with pytest.raises(SystemExit) as info:
        cli.precheck(list(overrides))
    assert info.value.code == cli.EXIT_BAD_INPUT
    return capsys.readouterr().err.strip().splitlines()


@pytest.fixture(scope="session")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[subprocess.CompletedProcess[str], dict[str, Any]]]:
    """`cli_run(*overrides)`: one real run per distinct override list for the whole session (runs cost seconds,
    and several test modules read the same run). Fails the calling test if the run wrote no results."""
    cache: dict[tuple[str, ...], tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]] = {}

    def get(*overrides: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        if overrides not in cache:
            cache[overrides] = run_cli(*overrides, tmp_path=tmp_path_factory.mktemp("cli"))
        else:  # the run this test needs was started by an earlier one: still a test that starts a process
            note_process_start(f"run.py {' '.join(overrides)} (cli_run's cached run)")
        proc, results = cache[overrides]
        assert results is not None, describe(proc)
        return proc, results

    return get


# The two runs the "core" checks, the results-contract checks and the AMP O0 check share.
DDP_RUN = ("strategy=ddp", "nprocs=2", *TINY, "iterations=40", "log_every=20")
SINGLE_RUN = ("strategy=single", "amp=O0", *TINY, "iterations=60", "log_every=20")


def tiny_batch(batch: int = 4, image_size: int = 8, num_classes: int = 10,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 3, image_size, image_size, generator=generator),
            torch.randint(0, num_classes, (batch,), generator=generator))


def sgd(lr: float = 0.1) -> Callable[[Any], torch.optim.Optimizer]:
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)


def prepare(amp: Any, model: torch.nn.Module, make_optimizer: Callable[[Any], torch.optim.Optimizer],
            ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An amp plugin's set-up phases as Strategy.setup_module runs them, with no strategy around: the cast,
    the optimizer over the parameters the plugin steps, the two joined."""
    model = amp.cast_module(model)
    return amp.connect(model, make_optimizer(amp.optimizer_params(model)))


STRATEGY_TARGETS = {"single": "strategies.single.SingleDevice", "ddp": "strategies.ddp.TorchDDP",
                    "dp": "strategies.dp.DataParallelStrategy", "apex_ddp": "strategies.apex_ddp.ApexDDP",
                    "allreduce": "strategies.allreduce.ManualAllReduce", "fsdp": "strategies.fsdp.FSDP2",
                    "zero": "strategies.zero.ZeroDDP", "tp": "strategies.tp.TensorParallel",
                    "pp": "strategies.pp.Pipeline"}


def config_dict(name: str = "single", **values: Any) -> dict[str, Any]:
    """A composed-looking config (no Hydra): tiny model, 12 images, 40 iterations; `values` override whole
    sections. An `amp` section without `_target_` gets the plugin its `impl` names."""
    from harness.core.amp_levels import plugin_path

    cfg: dict[str, Any] = {
        "strategy": {"_target_": STRATEGY_TARGETS[name]},
        "amp": {"level": "O0"},
        "model": {"_target_": "harness.rank.models.TinyCNN", "name": "tiny_cnn"},
        "optim": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.01, "momentum": 0.9},
        "data": {"name": "synthetic", "image_size": 8, "num_classes": 10},
        "gpus": None, "nprocs": 2, "batch_size": 12, "iterations": 40, "log_every": 20,
        "warmup_windows": 1, "seed": 0, "plan": {"calibration": "model", "predict": False},  # as the session's runs
        "launcher": {"name": "elastic", "start_method": "forkserver"},  # conf/launcher/elastic.yaml
    }
    cfg.update(values)
    cfg["amp"] = {"_target_": plugin_path(cfg["amp"].get("impl", "native")), **cfg["amp"]}
    return cfg


def run_config(name: str = "single", **values: Any) -> RunConfig:
    """`config_dict(...)` checked into a RunConfig; `name` is the strategy's (its section: `strategy=`)."""
    return RunConfig.from_dict(config_dict(name, **values), name)


def amp_plugin(spec: Any, device: torch.device | None = None) -> Any:
    """The amp plugin conf/amp would name for `spec.impl`, built for `device` (CPU by default)."""
    from amp import build_amp
    from harness.core.amp_levels import plugin_path

    return build_amp(plugin_path(spec.impl), spec, device or torch.device("cpu"))


def rank_spec(record_dir: Path, name: str = "single", **values: Any) -> Any:
    """What the runner hands run_rank for an inline run of `config_dict(strategy, **values)` on CPU."""
    from harness.launch.decide import run_plan
    from harness.launch.placement import Hardware
    from harness.rank.run_plan import RankSpec

    cfg = config_dict(name, **values)
    decided = run_plan(RunConfig.from_dict(cfg, name), Hardware(visible_gpus=(), cores=1), resolved=cfg)
    return RankSpec(plan=decided, record_dir=str(record_dir))


# ---- Runs watched while they go: signals, sockets, processes (tests/test_reliability.py, test_launcher.py) ----

def run_sweep(*overrides: str, sweep_dir: Path, timeout: float = CLI_TIMEOUT_S,
              quick_start: bool = True, one_core: bool = False) -> subprocess.CompletedProcess[str]:
    """`python run.py -m OVERRIDES hydra.sweep.dir=<sweep_dir>` from the repository root: one round unless the
    overrides name `repeat` (a sweep's rounds and racing are tests/test_rounds.py's); ranks as run_cli starts them.
    `one_core`: the sweep and its ranks on one core (one_core_of_this_worker)."""
    rounds = [] if any(o.startswith("repeat=") for o in overrides) else [ONE_ROUND]
    with one_core_of_this_worker() if one_core else contextlib.nullcontext():
        return RUN_PY.run(["run.py", "-m", *quick(overrides, quick_start), *rounds, f"hydra.sweep.dir={sweep_dir}"],
                          timeout)


@contextlib.contextmanager
def one_core_of_this_worker() -> Iterator[None]:
    """What starts inside runs on one core (pytest-xdist's worker k: core k; the calling thread's affinity, which
    a child inherits, restored after), so a run's placement takes one thread. A one-process run otherwise takes a
    thread per core, and while the suite's other worker keeps a core busy each of its many small kernels waits
    for the thread not scheduled: the tiny search test took 382 s beside one busy core, 30 s on one core (31 s on
    an idle machine). Not for every test: pinned, the suite's 4-rank runs share a core and slowed about as much as
    this gained (whole suite 765 s with every worker pinned, 691-807 s not)."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    cores = os.sched_getaffinity(0)
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    os.sched_setaffinity(0, {sorted(cores)[worker % len(cores)]})
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)


def start_ranks(fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int) -> None:
    """`torch.multiprocessing.start_processes(fn, args, nprocs)` with the ranks forked from this worker's fork
    server (started once, importing what the harness's own does: harness.launch.launcher.FORKSERVER_PRELOAD),
    instead of spawned: a spawned rank imported torch and the test's module again, 3 s of CPU each, 70 s over the
    suite's ranks. Each rank gets this process's environment as it is now (the server's is from when it started),
    as `harness.launch.launcher.in_worker_env` gives a run's; raises as start_processes does when a rank fails."""
    import torch.multiprocessing as mp

    from harness.launch.launcher import preload_forkserver

    preload_forkserver()
    mp.start_processes(_rank_in_env, args=(fn, dict(os.environ), args), nprocs=nprocs, join=True,
                       start_method="forkserver")


def _rank_in_env(rank: int, fn: Callable[..., Any], env: dict[str, str], args: tuple[Any, ...]) -> None:
    os.environ.clear()
    os.environ.update(env)
    fn(rank, *args)


def leave_at_once() -> None:
    """A spawned test rank, done and its results saved, leaves without the interpreter's shutdown, where about
    one in ten aborted after everything had passed ("terminate called without an active exception", a C++ thread
    of gloo still joinable as torch's libraries were unloaded; once "Resource deadlock avoided"), failing the test
    on nothing it checks. Call it only after the rank's last check: an exception before it still fails the test."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def is_alive(process: psutil.Process) -> bool:
    """Running and not a zombie (`is_running` also checks the PID was not reused)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def alive_pids(pids: Iterable[int | None]) -> list[int]:
    """Those of `pids` that still name a live, non-zombie process."""
    alive = []
    for pid in {p for p in pids if p}:
        try:
            if is_alive(psutil.Process(pid)):
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(alive)


def run_pids(results: dict[str, Any]) -> set[int]:
    """Every worker PID a results file names: the ranks' own records and the memory sampler's view."""
    pids = {r["pid"] for r in results.get("ranks") or []}
    pids |= {p["pid"] for p in (results.get("memory") or {}).get("per_process", []) if p.get("role") == "rank"}
    return pids


FORK_SERVER = "multiprocessing.forkserver"


def is_worker(process: psutil.Process) -> bool:
    """A spawned worker runs `spawn_main`; a forked one is a child of the fork server (and has its command line)."""
    command = " ".join(process.cmdline())
    if "spawn_main" in command:
        return True
    parent = process.parent()
    return FORK_SERVER in command and parent is not None and FORK_SERVER in " ".join(parent.cmdline())


class LiveRun:
    """`python run.py ARGS` in the background: its output collected line by line as it comes, and every
    process ever seen below it remembered, so a test can act mid-run and check that nothing outlives it.

    Use as a context manager: on the way out, whatever of the run is still alive is SIGKILLed (by PID)."""

    def __init__(self, *args: str, new_interpreter: bool = False) -> None:
        self.args = args
        # A session of its own: a Ctrl-C in the terminal running pytest does not reach the run directly. Forked
        # by RUN_PY unless the test acts while run.py imports (`new_interpreter`).
        self.proc: subprocess.Popen[str] | Forked = \
            subprocess.Popen([sys.executable, "run.py", *args], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True) if new_interpreter \
            else RUN_PY.start(["run.py", *args], live=True, new_session=True)
        self.started_at = time.time()
        self.ended_at: float | None = None  # time.time() right after the process was seen to exit
        self.out: list[str] = []
        self.err: list[str] = []
        self.seen: dict[int, psutil.Process] = {}
        self.worker_pids: set[int] = set()
        self._readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def descendants(self) -> list[psutil.Process]:
        """Every process below the launcher now (also remembered in `seen`)."""
        try:
            found = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for process in found:
            self.seen.setdefault(process.pid, process)
        return found

    def workers(self) -> list[psutil.Process]:
        """The worker processes (multiprocessing spawn children, or children of the fork server), in start
        order, i.e. rank order."""
        workers = []
        for process in self.descendants():
            try:
                if is_worker(process):
                    workers.append((process.create_time(), process.pid, process))
            except psutil.Error:
                continue
        self.worker_pids.update(pid for _, pid, _ in workers)
        return [process for *_, process in sorted(workers)]

    def wait_until(self, condition: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
        """Poll `condition` (noting descendants meanwhile) until it holds; False on timeout or if the run ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.descendants()
            if condition():
                return True
            if self.proc.poll() is not None:
                return condition()
            time.sleep(poll)
        return False

    def wait_for_output(self, text: str, timeout: float) -> bool:
        return self.wait_until(lambda: text in self.stdout, timeout)

    def signal(self, signum: int) -> float:
        """Send `signum` to the launcher only; returns when it was sent (time.time())."""
        self.descendants()
        sent = time.time()
        os.kill(self.proc.pid, signum)
        return sent

    def wait(self, timeout: float) -> int:
        """The exit code; `ended_at` is when the exit was seen. Raises subprocess.TimeoutExpired."""
        code = self.proc.wait(timeout)
        self.ended_at = time.time()
        for reader in self._readers:
            reader.join(timeout=10)
        return code

    def survivors(self, grace: float = 0.0) -> list[psutil.Process]:
        """Processes ever seen below the launcher still alive after waiting up to `grace` seconds."""
        deadline = time.monotonic() + grace
        while True:
            left = [p for p in self.seen.values() if is_alive(p)]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)

    def describe(self) -> str:
        return (f"exit {self.proc.returncode}\n--- stdout ---\n{self.stdout[-4000:]}\n"
                f"--- stderr ---\n{self.stderr[-4000:]}")

    def __enter__(self) -> LiveRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.descendants()
        for process in [*self.seen.values()]:
            if is_alive(process):
                try:
                    process.kill()
                except psutil.Error:
                    pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        for reader in self._readers:
            reader.join(timeout=10)
        if isinstance(self.proc, Forked):
            shutil.rmtree(self.proc.folder, ignore_errors=True)


# A DDP run that would go on for minutes: for tests that stop it mid-run.
LONG_DDP_RUN = ("strategy=ddp", "nprocs=2", *TINY, "iterations=100000", "log_every=20")
START_TIMEOUT_S = 180  # first window printed: process start-up on a loaded 2-core machine takes 5-30 s
# A rank failing, a worker SIGKILLed, SIGINT/SIGTERM to the launcher -> launcher gone. Measured: 1-3 s on
# 2 cores; the README's chain is agent notices within 0.1 s, SIGTERM to the others, SIGKILL after 10 s.
STOP_BOUND_S = 30


def check_stopped_by_signal(run: LiveRun, code: int, sent_at: float, signum: int, run_dir: Path) -> dict[str, Any]:
    """What SIGINT/SIGTERM to the launcher must leave: exit 130 within STOP_BOUND_S, results.json with
    status interrupted naming the signal and the windows measured so far, and no process of the run alive."""
    assert code == 130, run.describe()
    took = run.ended_at - sent_at
    assert took < STOP_BOUND_S, f"launcher exited {took:.1f} s after {signal.Signals(signum).name}"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "interrupted", results["error"]
    name = signal.Signals(signum).name
    assert name in results["error"] or f"signal: {int(signum)}" in results["error"], results["error"]
    ends = [w["end_iter"] for w in results["windows"]]
    assert ends and ends == list(range(20, 20 * len(ends) + 1, 20)), ends  # every window measured is kept
    assert "interrupted" in run.stderr
    workers_left = [p.pid for p in run.seen.values() if p.pid in run.worker_pids and is_alive(p)]
    assert not workers_left, f"workers alive after the launcher exited: {workers_left}"
    assert not run.survivors(grace=10), run.survivors()
    assert not alive_pids(run_pids(results))
    return results



SHARED_SWEEP = ("strategy=single,ddp,allreduce", "parity=true", *TINY, "model.norm=none", "iterations=20", "log_every=10",
                "plan.predict=true")
SHARED_GROUP = "shared_sweep"  # every test using `shared_sweep` carries xdist_group(SHARED_GROUP): one worker


@pytest.fixture(scope="session")
def shared_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One real sweep several modules read (its report, its jobs' logs, its parity records), instead of each
    running its own: `python run.py -m strategy=single,ddp,allreduce parity=true` on the tiny model, with two
    gloo workers for ddp and allreduce. Session-scoped: a module-scoped one is rebuilt whenever xdist runs
    another module's test in between. Returns the sweep folder and the finished process."""
    sweep = tmp_path_factory.mktemp("shared") / "sweep"
    proc = run_sweep(*SHARED_SWEEP, sweep_dir=sweep, timeout=400)
    assert proc.returncode == 0, describe(proc)
    return sweep, proc


MACHINE_FIGURES = {  # what harness.prediction measures of this machine, fixed for the tests (tests/test_planning.py
    # measures them for real once): rates in TFLOP/s per thread count, this machine's link per collective
    "rates": {f"{accelerator}:{threads}": {"float32": 0.1, "bfloat16": 0.2, "float16": 0.01}
              for accelerator in ("cpu", "cuda") for threads in range(1, 65)},
    "link": {"latency_us": 500.0, "bandwidth_gbps": 1.0}, "link_statistic": "mean by size, after compute",
    "per_op": {f"{op}{dtype}": {"latency_us": 500.0, "bandwidth_gbps": 1.0}
               for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast") for dtype in ("", ":bfloat16")}}


@pytest.fixture(autouse=True)
def no_fork_server_in_quick_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked to start processes runs the command line in this process at most (a precheck, a refused
    plan or search, a sweep whose launch is stubbed): the fork server cli would start for it is an interpreter
    importing torch, seconds of CPU such a test never uses, so it is not started there (ProcessWatch cannot see the
    server, which multiprocessing spawns by its own helper, but does see the process cli forks from it to know it
    is ready). A marked test, and every run.py in a subprocess, starts it as a user's command does."""
    if not any(request.node.get_closest_marker(mark) for mark in PROCESS_MARKS):
        monkeypatch.setattr("harness.cli.start_fork_server", lambda: None)


@pytest.fixture(autouse=True)
def root_logging_restored() -> Iterable[None]:
    """A command called in-process (cli.precheck, planning, run.py) sets the root logger's terminal handlers on the
    streams pytest captured for that test, and routes warnings to logging; the next test would log to those closed
    streams, and its own warnings_to_log would find the route already taken."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)  # run.py in-process routes warnings to logging (warnings_to_log): undone


@pytest.fixture(scope="session", autouse=True)
def fixed_machine_figures(tmp_path_factory: pytest.TempPathFactory) -> Iterable[Path]:
    """Every run of the session (subprocesses too) reads this machine's figures from a folder of the session's
    own, written here: no test measures them by chance, none waits for another's measurement."""
    from harness.prediction import hardware

    folder = tmp_path_factory.mktemp("machine")
    # and the bare model calibrated in-process (plan.calibration's default from the environment): a child per
    # run.py would cost the suite minutes; tests/test_prediction_predict.py and test_planning.py run the strategy's
    # and runs are not predicted unless a test asks (plan.predict=true): the suite's hundreds of runs would each
    # trace and calibrate (tests/test_plan_*.py and test_planning.py check predictions)
    settings = {"HARNESS_MACHINE_CACHE": str(folder), "HARNESS_PLAN_CALIBRATION": "model",
                "HARNESS_PLAN_PREDICT": "false"}
    previous = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    hardware.write_machine(MACHINE_FIGURES)
    yield folder
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session", autouse=True)
def results_files_match_the_shipped_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterable[None]:
    """Every results.json the harness wrote during the session (schema 2; files a test wrote by hand as older
    input carry their own schema) is checked against harness/core/results.schema.json at the session's end: a
    writer that drifts from the records fails the suite, naming the file."""
    yield
    import jsonschema

    from harness.core.results import SCHEMA
    from harness.core.results_schema import SCHEMA_PATH

    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    invalid = []
    for path in tmp_path_factory.getbasetemp().rglob("results.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a test's deliberately broken file; the report's own tests cover those
        if isinstance(data, dict) and data.get("schema") == SCHEMA:
            errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
            if errors:
                where = "/".join(map(str, errors[0].absolute_path)) or "(top)"
                invalid.append(f"{path}: {where}: {errors[0].message}")
    if invalid:
        pytest.fail(f"{len(invalid)} results.json not matching the shipped schema; first: {invalid[0]}")


def report_statuses(report_md: str) -> dict[str, str]:
    """{row label: "ok"} for every row report.md's tables hold (the rows that ran), and {row label: "<status>:
    <reason>"} for each row in its list of what did not run."""
    said: dict[str, str] = {}
    for line in report_md.splitlines():
        if line.startswith("| ") and not line.startswith("| combination"):
            said.setdefault(line.split(" | ")[0].removeprefix("| "), "ok")
        elif line.startswith("- ") and " — " in line:
            entry, _, labels = line[2:].rpartition(" — ")
            for label in labels.split(", "):
                said[label] = entry
    return said


# ---- Markers that tell the truth: a test that starts a process is marked `slow` ----

PROCESS_MARKS = ("slow", "bench", "gpu", "slurm")  # a test carrying one of these may start processes
NOT_SLOW = "starts a process: mark it @pytest.mark.slow"
# Not counted: system tools that answer in milliseconds, asked in passing (the harness's commit for results.json,
# platform.processor()). What `slow` is about is a Python process: an interpreter and torch starting, seconds.
QUICK_TOOLS = ("git", "uname")


class ProcessWatch:
    """Every process this pytest process starts, noted where it belongs: to the test whose body, or whose
    function-scoped fixture, started it; to a fixture of wider scope whose set-up started it (every test asking for
    that fixture needs the process, not only the one that happened to set it up first), unless that fixture is
    autouse (every test would be blamed for it: nobody is). Starts elsewhere (a fixture's teardown, a plugin)
    are nobody's.

    Noted: subprocess.Popen (subprocess.run and check_output, the elastic agent's binaries), multiprocessing's
    BaseProcess.start (every start method: torch.multiprocessing.start_processes, the elastic agent's workers,
    ProcessPoolExecutor's), and a bare os.fork; each start once (what it does inside is not noted again)."""

    def __init__(self) -> None:
        self.target: list[str] | None = None  # where a start is noted now
        self.by_fixture: dict[tuple[str, str], list[str]] = {}  # (name, baseid) of a wider-scoped fixture -> starts
        self._depth = threading.local()

    def note(self, what: str | None) -> None:
        if what is not None and self.target is not None and not getattr(self._depth, "n", 0):
            self.target.append(what)

    def wrap(self, owner: type, name: str, describe: Callable[..., str | None]) -> None:
        original = getattr(owner, name)
        if getattr(original, "_process_watch", False):
            return
        watch = self

        def noted(this: Any, *args: Any, **kwargs: Any) -> Any:
            watch.note(describe(this, *args))
            watch._depth.n = getattr(watch._depth, "n", 0) + 1
            try:
                return original(this, *args, **kwargs)
            finally:
                watch._depth.n -= 1

        noted._process_watch = True  # type: ignore[attr-defined]
        setattr(owner, name, noted)

    def install(self) -> None:
        import multiprocessing.process

        def command(_: Any, args: Any = "?", *__: Any) -> str | None:
            words = [os.fsdecode(a) for a in ([args] if isinstance(args, str | bytes | os.PathLike) else args)]
            program = " ".join(words).split()[:1]
            return None if program and os.path.basename(program[0]) in QUICK_TOOLS else " ".join(words)

        def process(this: Any, *_: Any) -> str:
            target = getattr(this, "_target", None)
            return f"{type(this).__name__} {this.name} ({getattr(target, '__qualname__', target)})"

        self.wrap(subprocess.Popen, "_execute_child", command)
        self.wrap(multiprocessing.process.BaseProcess, "start", process)
        os.register_at_fork(before=lambda: self.note("os.fork()"))

    def starts(self, item: pytest.Item) -> list[str]:
        """What `item` started, or needed started by a fixture it asks for."""
        started = list(item.stash.get(STARTED, []))
        for name in getattr(item, "fixturenames", ()):
            for (fixture, baseid), starts in self.by_fixture.items():
                if fixture == name and item.nodeid.startswith(baseid):
                    started += [f"{what} (fixture {name})" for what in starts]
        return started

    # The hooks, registered as a plugin of their own (pytest_configure below): a conftest's own hooks are not
    # called for a session-scoped fixture, whose request belongs to the session, above this folder.

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Any:
        if fixturedef.scope == "function":
            return (yield)  # the test's own: noted with it
        outer, own = self.target, []
        self.target = own
        try:
            return (yield)
        finally:
            self.target = outer
            if own and not getattr(fixturedef, "_autouse", False):
                self.by_fixture.setdefault((fixturedef.argname, fixturedef.baseid), []).extend(own)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Any:
        self.target = item.stash.setdefault(STARTED, [])
        try:
            return (yield)
        finally:
            self.target = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """A test not marked slow (nor bench, gpu, slurm) that started a process fails, saying so."""
        self.target = item.stash.setdefault(STARTED, [])
        try:
            result = yield
        finally:
            self.target = None
        started = self.starts(item)
        if started and not any(item.get_closest_marker(mark) for mark in PROCESS_MARKS):
            shown = "; ".join(what[:160] for what in started[:3])
            more = f"; {len(started) - 3} more" if len(started) > 3 else ""
            pytest.fail(f"{NOT_SLOW} (started: {shown}{more})", pytrace=False)
        return result


WATCH = ProcessWatch()
WATCH.install()
STARTED = pytest.StashKey[list[str]]()


def note_process_start(what: str) -> None:
    """A start that a cache saved this time (cli_run's): the test still needs the process, and says so."""
    WATCH.note(what)


def pytest_unconfigure(config: pytest.Config) -> None:
    RUN_PY.stop()


def pytest_configure(config: pytest.Config) -> None:
    # A shell starts a background job (`.ci/run &` in a script) with Ctrl-C ignored, and every process below
    # inherits that: the tests that press Ctrl-C at a run would wait for a run that never sees it. As a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not config.pluginmanager.is_registered(WATCH):
        config.pluginmanager.register(WATCH, "process-watch")
