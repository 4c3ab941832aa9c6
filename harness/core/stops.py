"""Stopping and failing, as both sides see it: the signals that stop a run on record (a rank's StopRequest,
the parent's and a SLURM job's handlers), the exception they raise, and the one line that names an error."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any


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
