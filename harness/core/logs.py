"""Where the harness's output goes: everything through `logging`, rank zero to the terminal, every rank
into the run's `run.log`.

In the launching process Hydra sets logging up from conf/hydra/job_logging/harness.yaml (a terminal
handler and the run folder's `run.log`). Worker processes never run Hydra: `setup_worker` gives them the
same two destinations, the terminal for rank zero only, and `run.log` (appended to) for all.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

FILE_FORMAT = "[%(asctime)s][%(processName)s %(process)d][%(levelname)s] %(message)s"


class TerminalFormatter(logging.Formatter):
    """The message as it is; warnings and errors say so first."""

    PREFIX = {logging.WARNING: "warning: ", logging.ERROR: "error: ", logging.CRITICAL: "error: "}

    def format(self, record: logging.LogRecord) -> str:
        return self.PREFIX.get(record.levelno, "") + super().format(record)


class RankZeroFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        return self.rank == 0


def setup_worker(log_file: str | Path | None, rank: int) -> None:
    """A launched rank: rank 0's records to the terminal, every rank's appended to `log_file` (the run's
    run.log). Whatever else the process writes to its stdout and stderr (libraries' prints and C++ lines: "No
    CUDA runtime is found", the profiler's USDT notes, a traceback) goes to run.log too, not to the terminal:
    file descriptors 1 and 2 are pointed at run.log, the terminal kept for the harness's own records."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.INFO)
    terminal_out, terminal_err = sys.stdout, sys.stderr
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        terminal_out = os.fdopen(os.dup(1), "w", buffering=1)
        terminal_err = os.fdopen(os.dup(2), "w", buffering=1)
        with open(log_file, "a") as noise:
            os.dup2(noise.fileno(), 1)
            os.dup2(noise.fileno(), 2)
    out, err = logging.StreamHandler(terminal_out), logging.StreamHandler(terminal_err)
    out.addFilter(BelowWarning())
    err.setLevel(logging.WARNING)
    for terminal in (out, err):
        terminal.setFormatter(TerminalFormatter("%(message)s"))
        terminal.addFilter(RankZeroFilter(rank))
        root.addHandler(terminal)
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        file = logging.FileHandler(log_file, mode="a")  # ranks append whole lines to the one file
        file.setFormatter(logging.Formatter(FILE_FORMAT.replace("%(processName)s", f"rank {rank}")))
        root.addHandler(file)
    for noisy in ("torch.distributed.elastic", "torch.distributed", "torch.multiprocessing"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when the record comes (tests swap it; so may a caller)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def refusals() -> logging.Logger:
    """The logger for a refused command line: one line on stderr, whatever else logging is set up to do
    (it may run before Hydra has set up anything, or inside a Hydra job about to remove its folder)."""
    logger = logging.getLogger("harness.refused")
    if not logger.handlers:
        handler = CurrentStderr()
        handler.setFormatter(TerminalFormatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    return logger


LIBRARY_WARNINGS = "py.warnings"  # the logger Python's `warnings` go to once captured (logging.captureWarnings)


class NoLibraryWarnings(logging.Filter):
    """Keeps a library's Python warning off the terminal (the harness itself warns through `logging`, never
    `warnings`): a user cannot act on one (FSDP's about views, a deprecation), and in the terminal it lands
    between a run's or a search's lines. The log file beside the run keeps it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != LIBRARY_WARNINGS


def warnings_to_log() -> None:
    """Python's warnings as records of the `py.warnings` logger: into the log files, not the terminal, whose
    handlers filter them out (NoLibraryWarnings; conf/hydra/job_logging/harness.yaml, setup_cli)."""
    logging.captureWarnings(True)


class BelowWarning(logging.Filter):
    """Information to stdout; warnings and errors take stderr (a handler of their own)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING


def setup_cli() -> None:
    """A command of its own (`python -m harness.report`): information on stdout, warnings and errors on
    stderr."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    out, err = logging.StreamHandler(sys.stdout), logging.StreamHandler(sys.stderr)
    out.addFilter(BelowWarning())
    err.setLevel(logging.WARNING)
    for handler in (out, err):
        handler.setFormatter(TerminalFormatter("%(message)s"))
        handler.addFilter(NoLibraryWarnings())
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def add_file(path: Path) -> logging.Handler:
    """Also write everything to `path` (a sweep's own log, beside its report); remove it when done."""
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    logging.getLogger().addHandler(handler)
    return handler
