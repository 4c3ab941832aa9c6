"""Stopping and failing, as both sides see it: the signals that stop a run on record (a rank's StopRequest,
the parent's and a SLURM job's handlers), the exception they raise, and the one line that names an error."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import psutil


class Interrupted(Exception):
    """SIGTERM/SIGINT/SIGUSR2 reached this process: stop, and record what was measured."""


# SIGUSR2: what SLURM sends before a job's time limit (`--signal=USR2@N`, set by the submitit launcher).
# Its default action kills a process outright, and SLURM signals every process of the job, workers included.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
WHY = {"SIGUSR2": "SIGUSR2, SLURM's warning that the job's time limit is near (or that it is preempted)"}


def stopped_by(name: str) -> str:
    """`stopped by SIGTERM`; what the signal means where that is not obvious."""
    return f"stopped by {WHY.get(name, name)}"


class StopRequest:
    """SIGTERM/SIGINT/SIGUSR2 are noted by the handler, never raised from it: the rank stops at its next
    iteration (or before training starts). A signal can then never land inside the record's write, whatever
    the timing, so what a rank measured survives the launcher stopping it."""

    SIGNALS = STOP_SIGNALS

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> StopRequest:
        try:
            self._previous = {sig: signal.signal(sig, self._note) for sig in self.SIGNALS}
        except ValueError:  # not the main thread: whoever runs us handles signals
            self._previous = {}
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.signal = self.signal or signal.Signals(signum).name

    def check(self) -> None:
        if self.signal is not None:
            raise Interrupted(stopped_by(self.signal))


INTERRUPTED_BEFORE_RUNS = "interrupted before the first run started: nothing was run"
INTERRUPTED_BETWEEN_RUNS = "interrupted: no further run is started (runs that finished keep their results)"


@contextmanager
def interrupt_ends_quietly(said: str) -> Iterator[None]:
    """Ctrl-C outside a run (imports, the pre-flight checks, Hydra's start-up, between a sweep's jobs): `said`
    in one line and exit 130, not a traceback of wherever Python happened to be. A run stopped mid-way says
    so itself and exits 130 on its own (harness.cli.task), its results written; a second Ctrl-C while this
    process exits ends it at once, quietly too."""
    global _ctrl_c_seen
    received: list[int] = []
    outer, _ctrl_c_seen = _ctrl_c_seen, received

    def interrupt(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if importing(frame):  # raised here, it could cross a C extension's initialisation: torch's abort()s
            signal_after_imports()
            return
        raise KeyboardInterrupt

    def dropped(unraisable: Any) -> None:
        if not (received and unraisable.exc_type is KeyboardInterrupt):
            previous_hook(unraisable)  # "Exception ignored in ...": a traceback, unless it is a taken Ctrl-C

    # Python's own handler, noting that it fired (an interrupt that surfaces as some other exception is still
    # one), and sending it again after an import it lands in (signal_after_imports). A handler set by what runs
    # inside (a run's stop signals) replaces this one while it runs.
    mine = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    previous = signal.signal(signal.SIGINT, interrupt) if mine else None
    previous_hook, sys.unraisablehook = sys.unraisablehook, dropped
    try:
        yield
        if received:  # raised where Python drops exceptions (ctrl_c_lost): the block ended anyway
            _end_interrupted(said)
    except Exception:
        if not received:
            raise
        _end_interrupted(said)
    except KeyboardInterrupt:
        _end_interrupted(said)
    finally:
        _ctrl_c_seen = outer
        if sys.unraisablehook is dropped:
            sys.unraisablehook = previous_hook
        if mine and signal.getsignal(signal.SIGINT) is interrupt:
            signal.signal(signal.SIGINT, previous)


_ctrl_c_seen: list[int] = []  # the Ctrl-Cs the innermost interrupt_ends_quietly block's handler has taken


def ctrl_c_lost() -> bool:
    """A Ctrl-C was taken and yet a run is about to start: its KeyboardInterrupt was raised where Python drops
    exceptions ("Exception ignored in ..."): a weakref callback, a __del__, run by the garbage collector at any
    bytecode. Seen in a sweep: a Ctrl-C as one job ended was lost that way, and the next job ran to its end.
    Asked where a job or a run starts, which then stops instead (a Ctrl-C that was heard ends the process
    before any starts; one held back by an import is sent again as the import ends, and stops it all the same)."""
    return bool(_ctrl_c_seen)


def importing(frame: FrameType | None) -> bool:
    """Python is executing a module's body (an import, at whatever depth). A KeyboardInterrupt raised there
    passes through whatever called that import, C++ included: torch's initialisation, meeting one, ends the
    process with SIGABRT (exit -6 instead of 130, seen in CI during `import torch`)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


IMPORT_POLL_S = 0.01
_after_imports = threading.Lock()  # held while a watcher waits: one at a time


def signal_after_imports() -> None:
    """SIGINT to the main thread again as soon as it has left every import (polled from a thread), where the
    handler of that moment takes it as it would have: raised outside a run, a run's stop inside one. Ending the
    process in the import instead would skip what an interrupt does next (a sweep's report of what finished)."""
    if not _after_imports.acquire(blocking=False):
        return  # a watcher already waits to send one

    def watch() -> None:
        try:
            main = threading.main_thread()
            while main.is_alive() and importing(sys._current_frames().get(main.ident or 0)):
                time.sleep(IMPORT_POLL_S)
        finally:
            _after_imports.release()
        if main.is_alive() and main.ident is not None:
            signal.pthread_kill(main.ident, signal.SIGINT)  # to the main thread: a wait it is in returns early

    threading.Thread(target=watch, name="ctrl-c-after-imports", daemon=True).start()


def _end_interrupted(said: str) -> None:
    from harness.core.errors import EXIT_INTERRUPTED
    from harness.core.logs import refusals

    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(EXIT_INTERRUPTED))
    end_descendants()
    refusals().warning("%s", said)
    sys.exit(EXIT_INTERRUPTED)


def end_descendants() -> None:
    """Every process below this one, SIGTERMed as this one exits on a Ctrl-C: the helpers that ignore Ctrl-C (the
    fork server, the calibration child: harness.cli.start_fork_server), so that exiting waits for none of them, and
    a child the fork server is still starting, which would otherwise print a traceback of its own (it reads a
    semaphore this process removes as it exits). A run's ranks are stopped, on record, before this."""
    for child in psutil.Process().children(recursive=True):
        try:
            child.terminate()
        except psutil.Error:
            pass


@contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ctrl-C ignored while a helper process starts: it inherits that (Python then installs no handler of its
    own), so a Ctrl-C at the terminal, which signals every process of the group, is left to this process."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def caused_by(error: BaseException | None, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kinds):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def last_line(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}".rstrip(": ")


LAUNCHER_GONE_GRACE_S = 10  # a rank whose launcher died: SIGTERM to itself, SIGKILL this much later


class LauncherWatch:
    """A rank's watch on the process that launched it: when the launcher is gone, however it ended (SIGKILL,
    the OOM killer, a caller's time-out), the rank is stopped as a signal would stop it (SIGTERM to itself: it
    writes its record and ends), and killed `grace_s` later if it has not ended. A rank whose record is
    written (`record_written()`) ends at most `teardown_s` later, whoever it waits for: a process group's
    teardown with a peer gone blocks for ever. Polled from a daemon thread, twice a second."""

    POLL_S = 0.5

    def __init__(self, pid: int, create_time: float, grace_s: float, teardown_s: float) -> None:
        self.pid, self.create_time, self.grace_s, self.teardown_s = pid, create_time, grace_s, teardown_s
        self._deadline: float | None = None

    def start(self) -> LauncherWatch:
        threading.Thread(target=self._watch, name="launcher-watch", daemon=True).start()
        return self

    def record_written(self) -> None:
        self._deadline = time.monotonic() + self.teardown_s

    def launcher_alive(self) -> bool:
        """The same process (not a reused PID), and not a zombie its own parent has yet to reap."""
        try:
            process = psutil.Process(self.pid)
            return abs(process.create_time() - self.create_time) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _watch(self) -> None:
        kill_at: float | None = None
        while True:  # a daemon: it ends with the process
            time.sleep(self.POLL_S)
            now = time.monotonic()
            if kill_at is None and not self.launcher_alive():
                os.kill(os.getpid(), signal.SIGTERM)  # StopRequest notes it: the record says why
                kill_at = now + self.grace_s
            if (kill_at is not None and now >= kill_at) or (self._deadline is not None and now >= self._deadline):
                os.kill(os.getpid(), signal.SIGKILL)
