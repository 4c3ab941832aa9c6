"""Window timing: devices are synchronized at window edges only, never inside a window."""

from __future__ import annotations

import math
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
    data_wait_s: float | None = None  # time the loop spent getting its batches (host clock)
    profiled: bool = False  # under torch.profiler: its time is the profiler's too, so it is not steady

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class WindowClock:
    """Marks window edges. `sync` waits for the devices; `clock` is injectable for tests.

    `decide(window) -> bool`, given to `edge`, runs after the window is closed and before the next one
    opens (iterations=auto asks the ranks whether to stop there; profile=true starts and stops the profiler
    there): its time is excluded from the windows and from the cumulative time alike, so that the windows
    always add up to the cumulative time.

    `data_wait()` is the seconds the loop has waited for data so far (the batch source counts them); a
    window's share is the difference across it. `profiled_window` (0-based) is marked `profiled`.
    `spans` holds each window's (start, end) in Unix time, to line windows up with the sampler's readings."""

    def __init__(self, sync: Callable[[], None], warmup_windows: int,
                 clock: Callable[[], float] = time.perf_counter, data_wait: Callable[[], float] | None = None,
                 profiled_window: int | None = None, unix: Callable[[], float] = time.time) -> None:
        self._sync, self._clock, self._warmup_windows = sync, clock, warmup_windows
        self._data_wait, self._profiled, self._unix = data_wait, profiled_window, unix
        self._start = self._last = 0.0
        self._excluded = 0.0
        self._waited = 0.0
        self._opened_unix = 0.0
        self.windows: list[Window] = []
        self.spans: list[tuple[float, float]] = []
        self.stop = False  # a `decide` said so

    def start(self) -> None:
        self._sync()
        self._start = self._last = self._clock()
        self._opened_unix = self._unix()
        self._waited = self._data_wait() if self._data_wait else 0.0

    def edge(self, end_iter: int, loss: Callable[[], float] | None = None,
             decide: Callable[[Window], bool] | None = None) -> Window:
        """Close the window ending at `end_iter`; `loss` is read only after the sync."""
        self._sync()
        now = self._clock()
        closed_unix = self._unix()
        waited = None
        if self._data_wait is not None:
            total = self._data_wait()
            waited, self._waited = total - self._waited, total
        window = Window(end_iter=end_iter, seconds=now - self._last,
                        cumulative_seconds=now - self._start - self._excluded,
                        warmup=len(self.windows) < self._warmup_windows,
                        loss=None if loss is None else float(loss()), data_wait_s=waited,
                        profiled=len(self.windows) == self._profiled)
        self.windows.append(window)
        self.spans.append((self._opened_unix, closed_unix))
        self._last = now
        if decide is not None:
            self.stop = decide(window)
            self._last = self._clock()
            self._excluded += self._last - now
        self._opened_unix = self._unix()
        return window


class AutoStop:
    """iterations=auto: stop at the first window edge where the median of the steady windows is known to
    within `precision_pct` (half-width of its 95 % confidence interval, distribution-free, from order
    statistics), or once `max_seconds` have passed in the loop; `reason` says which.

    Every rank must stop at the same edge (or the others wait forever in a collective), so the decision is
    made on the run's clock, the slowest rank's: `slowest(cumulative)` returns the maximum over ranks (an
    all-reduce); every rank then computes the same decision from the same numbers."""

    MIN_WINDOWS = 6  # fewer steady windows have no 95 % interval for their median

    def __init__(self, precision_pct: float, max_seconds: float, slowest: Callable[[float], float]) -> None:
        self.precision_pct, self.max_seconds, self._slowest = precision_pct, max_seconds, slowest
        self._previous = 0.0
        self.steady: list[float] = []
        self.reason: str | None = None

    def __call__(self, window: Window) -> bool:
        cumulative = self._slowest(window.cumulative_seconds)
        seconds, self._previous = cumulative - self._previous, cumulative
        if not window.warmup and not window.profiled:
            self.steady.append(seconds)
        if len(self.steady) >= self.MIN_WINDOWS and relative_half_width(self.steady) * 100 <= self.precision_pct:
            self.reason = "precision"
        elif cumulative >= self.max_seconds:
            self.reason = "max_seconds"
        return self.reason is not None


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: order statistics x(k) and x(n-k+1), with k the
    largest rank such that P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2."""
    ordered, n = sorted(values), len(values)
    tail, k, cumulative = (1 - confidence) / 2, 0, 0.0
    while k < n and cumulative + math.comb(n, k) / 2**n <= tail:
        cumulative += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        return ordered[0], ordered[-1]  # too few values for the confidence asked: the whole range
    return ordered[k - 1], ordered[n - k]


def relative_half_width(values: Sequence[float]) -> float:
    low, high = median_interval(values)
    return (high - low) / 2 / statistics.median(values)


def merge_ranks(per_rank: Sequence[Sequence[Window]], warmup_windows: int) -> list[Window]:
    """The run's clock is its slowest rank: cumulative time at each edge is the max over ranks.

    Ranks start together (a barrier precedes `start`), so max-of-cumulative is the wall time at which
    the last rank finished that many iterations. The run's data wait in a window is the longest any rank
    waited (in a collective strategy the others wait for that rank too). Only edges every rank with windows reached are kept;
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
        waits = [w[i].data_wait_s for w in ranks if w[i].data_wait_s is not None]
        merged.append(Window(end_iter=ranks[0][i].end_iter, seconds=cumulative - previous,
                             cumulative_seconds=cumulative, warmup=i < warmup_windows,
                             loss=statistics.fmean(losses) if losses else None,
                             data_wait_s=max(waits) if waits else None, profiled=any(w[i].profiled for w in ranks)))
        previous = cumulative
    return merged


def steady_windows(windows: Sequence[Window]) -> list[Window]:
    """After warm-up, and not profiled (the profiler's own cost is in a profiled window's time)."""
    return [w for w in windows if not w.warmup and not w.profiled]


def data_wait_share(windows: Sequence[Window]) -> float | None:
    """The share of the steady windows' time the loop spent waiting for data; None where it was not measured."""
    steady = steady_windows(windows)
    seconds = sum(w.seconds for w in steady)
    if not steady or seconds <= 0 or any(w.data_wait_s is None for w in steady):
        return None
    return sum(w.data_wait_s or 0.0 for w in steady) / seconds


def steady_throughput(windows: Sequence[Window], global_batch: int, log_every: int) -> float | None:
    """Images per second over the windows after warm-up; None if warm-up took them all."""
    steady = steady_windows(windows)
    seconds = sum(w.seconds for w in steady)
    if not steady or seconds <= 0:
        return None
    return global_batch * log_every * len(steady) / seconds
