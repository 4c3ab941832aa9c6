"""Window timing: devices are synchronized at window edges only, never inside a window."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Window:
    end_iter: int
    seconds: float
    cumulative_seconds: float
    warmup: bool
    loss: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class WindowClock:
    """Marks window edges. `sync` waits for the devices; `clock` is injectable for tests."""

    def __init__(self, sync: Callable[[], None], warmup_windows: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._sync, self._clock, self._warmup_windows = sync, clock, warmup_windows
        self._start = self._last = 0.0
        self.windows: list[Window] = []

    def start(self) -> None:
        self._sync()
        self._start = self._last = self._clock()

    def edge(self, end_iter: int, loss: Callable[[], float] | None = None) -> Window:
        """Close the window ending at `end_iter`; `loss` is read only after the sync."""
        self._sync()
        now = self._clock()
        window = Window(end_iter=end_iter, seconds=now - self._last, cumulative_seconds=now - self._start,
                        warmup=len(self.windows) < self._warmup_windows,
                        loss=None if loss is None else float(loss()))
        self._last = now
        self.windows.append(window)
        return window


def merge_ranks(per_rank: Sequence[Sequence[Window]], warmup_windows: int) -> list[Window]:
    """The run's clock is its slowest rank: cumulative time at each edge is the max over ranks.

    Ranks start together (a barrier precedes `start`), so max-of-cumulative is the wall time at which
    the last rank finished that many iterations. Only edges every rank with windows reached are kept;
    a rank that failed before its first edge has none and is left out, so a failed run keeps what the
    others measured.
    """
    ranks = [list(w) for w in per_rank if w]
    if not ranks:
        return []
    count = min(len(w) for w in ranks)
    merged: list[Window] = []
    previous = 0.0
    for i in range(count):
        cumulative = max(w[i].cumulative_seconds for w in ranks)
        losses = [w[i].loss for w in ranks if w[i].loss is not None]
        merged.append(Window(end_iter=ranks[0][i].end_iter, seconds=cumulative - previous,
                             cumulative_seconds=cumulative, warmup=i < warmup_windows,
                             loss=statistics.fmean(losses) if losses else None))
        previous = cumulative
    return merged


def steady_windows(windows: Sequence[Window]) -> list[Window]:
    return [w for w in windows if not w.warmup]


def steady_throughput(windows: Sequence[Window], global_batch: int, log_every: int) -> float | None:
    """Images per second over the windows after warm-up; None if warm-up took them all."""
    steady = steady_windows(windows)
    seconds = sum(w.seconds for w in steady)
    if not steady or seconds <= 0:
        return None
    return global_batch * log_every * len(steady) / seconds
