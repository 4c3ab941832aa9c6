"""harness.core.timing and the trainer's use of it, driven by a fake clock: windows, warm-up, sync placement."""

from __future__ import annotations

import pytest
import torch
from conftest import amp_plugin, prepare, tiny_batch

from harness.core.amp_levels import AmpConfig, resolve
from harness.core.timing import (
    AutoStop,
    Window,
    WindowClock,
    median_interval,
    merge_ranks,
    relative_half_width,
    steady_throughput,
    steady_windows,
)
from harness.rank.data import SyntheticSource
from harness.rank.models import TinyCNN
from harness.rank.trainer import train


class FakeClock:
    """Returns the scripted times in order; counts syncs and logs every event in `events`."""

    def __init__(self, times: list[float], events: list[tuple] | None = None) -> None:
        self.times, self.reads, self.syncs = list(times), 0, 0
        self.events = events if events is not None else []

    def clock(self) -> float:
        self.events.append(("clock",))
        value = self.times[self.reads]
        self.reads += 1
        return value

    def sync(self) -> None:
        self.syncs += 1
        self.events.append(("sync",))


def test_window_clock_seconds_cumulative_warmup_and_one_sync_per_edge():
    fake = FakeClock([10.0, 13.0, 14.5, 15.5, 17.0])
    wc = WindowClock(fake.sync, warmup_windows=2, clock=fake.clock)
    wc.start()
    assert fake.syncs == 1
    losses = iter([2.0, 1.5, 1.2, 1.0])
    for n, end in enumerate((10, 20, 30, 40), start=1):
        window = wc.edge(end, lambda: next(losses))
        assert fake.syncs == 1 + n  # exactly one per edge: nothing between edges waits
        assert window is wc.windows[-1]
    assert [w.end_iter for w in wc.windows] == [10, 20, 30, 40]
    assert [w.seconds for w in wc.windows] == [3.0, 1.5, 1.0, 1.5]
    assert [w.cumulative_seconds for w in wc.windows] == [3.0, 4.5, 5.5, 7.0]
    assert [w.warmup for w in wc.windows] == [True, True, False, False]
    assert [w.loss for w in wc.windows] == [2.0, 1.5, 1.2, 1.0]
    assert fake.syncs == 5 and fake.reads == 5


def test_edge_reads_the_clock_and_the_loss_after_the_sync():
    events: list[tuple] = []
    fake = FakeClock([0.0, 1.0], events)
    wc = WindowClock(fake.sync, warmup_windows=0, clock=fake.clock)
    wc.start()
    events.clear()
    window = wc.edge(5, lambda: events.append(("loss",)) or 0.5)
    assert events == [("sync",), ("clock",), ("loss",)]
    assert window.loss == 0.5 and window.warmup is False


def test_no_loss_callable_means_no_loss():
    fake = FakeClock([0.0, 2.0])
    wc = WindowClock(fake.sync, warmup_windows=1, clock=fake.clock)
    wc.start()
    assert wc.edge(10).loss is None


def test_zero_warmup_windows_marks_none():
    fake = FakeClock([0.0, 1.0, 2.0])
    wc = WindowClock(fake.sync, warmup_windows=0, clock=fake.clock)
    wc.start()
    wc.edge(1)
    wc.edge(2)
    assert not any(w.warmup for w in wc.windows)


def windows(cumulative: list[float], losses: list[float | None] | None = None, every: int = 10) -> list[Window]:
    out, previous = [], 0.0
    for i, c in enumerate(cumulative):
        out.append(Window(end_iter=every * (i + 1), seconds=c - previous, cumulative_seconds=c, warmup=False,
                          loss=None if losses is None else losses[i]))
        previous = c
    return out


def test_merge_ranks_takes_the_slowest_rank_at_every_edge():
    rank0 = windows([2.0, 3.0, 6.0], [1.0, 0.8, 0.6])
    rank1 = windows([2.5, 4.0, 5.0], [3.0, 1.2, 0.4])
    merged = merge_ranks([rank0, rank1], warmup_windows=1)
    assert [w.end_iter for w in merged] == [10, 20, 30]
    assert [w.cumulative_seconds for w in merged] == [2.5, 4.0, 6.0]
    assert [w.seconds for w in merged] == [2.5, 1.5, 2.0]  # differences of the merged cumulatives
    assert [w.warmup for w in merged] == [True, False, False]
    assert [w.loss for w in merged] == pytest.approx([2.0, 1.0, 0.5])  # mean over ranks


def test_merge_ranks_keeps_only_edges_every_rank_reached():
    merged = merge_ranks([windows([1.0, 2.0, 3.0]), windows([1.5, 2.5])], warmup_windows=0)
    assert [w.end_iter for w in merged] == [10, 20]
    assert [w.cumulative_seconds for w in merged] == [1.5, 2.5]
    assert all(w.loss is None for w in merged)


def test_merge_ranks_of_nothing_is_empty():
    assert merge_ranks([], warmup_windows=1) == []
    assert merge_ranks([[], []], warmup_windows=1) == []


def test_merge_of_one_rank_is_that_rank_with_warmup_reapplied():
    rank0 = windows([1.0, 3.0], [0.9, 0.7])
    merged = merge_ranks([rank0], warmup_windows=1)
    assert [(w.seconds, w.cumulative_seconds, w.loss) for w in merged] == [(1.0, 1.0, 0.9), (2.0, 3.0, 0.7)]
    assert [w.warmup for w in merged] == [True, False]


def test_steady_throughput_excludes_warmup():
    ws = [Window(20, 10.0, 10.0, True), Window(40, 2.0, 12.0, False), Window(60, 3.0, 15.0, False)]
    # 2 steady windows x 20 iterations x 8 images in 5 s; the 10 s warm-up window does not count
    assert steady_throughput(ws, global_batch=8, log_every=20) == pytest.approx(2 * 20 * 8 / 5.0)
    assert steady_windows(ws) == ws[1:]


def test_steady_throughput_is_none_when_warmup_took_every_window():
    assert steady_throughput([Window(20, 1.0, 1.0, True)], global_batch=8, log_every=20) is None
    assert steady_throughput([], global_batch=8, log_every=20) is None
    assert steady_throughput([Window(20, 0.0, 0.0, False)], global_batch=8, log_every=20) is None


@pytest.mark.parametrize("level", ["O0", "O2"])
def test_trainer_syncs_only_at_window_edges(level):
    iterations, log_every = 40, 10
    events: list[tuple] = []
    fake = FakeClock([float(t) for t in range(iterations // log_every + 1)], events)
    clock = WindowClock(fake.sync, warmup_windows=1, clock=fake.clock)
    torch.manual_seed(0)
    precision = amp_plugin(resolve(AmpConfig(level=level), "cpu"))
    model, optimizer = prepare(precision, TinyCNN(num_classes=10, width=4),
                                         lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9))
    model = precision.wrap_module(model)
    seen: list[Window] = []
    result = train(model, optimizer, precision, SyntheticSource([tiny_batch()]), clock, iterations, log_every,
                   before_step=lambda it: events.append(("step", it)), on_window=seen.append)

    assert fake.syncs == iterations // log_every + 1
    # every sync comes right after the last step of a window (or before the first step), never inside one
    steps_before_sync = []
    last_step = 0
    for event in events:
        if event[0] == "step":
            last_step = event[1]
        elif event[0] == "sync":
            steps_before_sync.append(last_step)
    assert steps_before_sync == [0, 10, 20, 30, 40]
    assert result == seen == clock.windows
    assert [w.end_iter for w in result] == [10, 20, 30, 40]
    assert [w.seconds for w in result] == [1.0] * 4
    assert [w.warmup for w in result] == [True, False, False, False]
    assert all(w.loss is not None and w.loss == w.loss for w in result)  # finite, read at the edge
    assert result[-1].loss < result[0].loss


# ---- iterations=auto ------------------------------------------------------------------------------------

def test_median_interval_from_order_statistics():
    """n=6: P(Bin(6, 1/2) = 0) = 1/64 <= 2.5 %, P(<= 1) = 7/64 > 2.5 %: the interval is [x(1), x(6)].
    n=10: P(<= 1) = 11/1024 <= 2.5 %, P(<= 2) = 56/1024 > 2.5 %: [x(2), x(9)]."""
    assert median_interval([5.0, 1.0, 3.0, 2.0, 6.0, 4.0]) == (1.0, 6.0)
    assert median_interval([float(v) for v in range(1, 11)]) == (2.0, 9.0)
    assert median_interval([7.0, 9.0]) == (7.0, 9.0)  # too few for 95 %: the whole range
    # half-width relative to the median: (9 - 2) / 2 / 5.5
    assert relative_half_width([float(v) for v in range(1, 11)]) == pytest.approx(3.5 / 5.5)


def test_auto_stop_waits_for_six_steady_windows_within_the_precision():
    stop = AutoStop(precision_pct=2.0, max_seconds=1e9, slowest=lambda x: x)
    cumulative = 0.0
    decisions = []
    for i, seconds in enumerate([3.0, 1.0, 1.02, 0.98, 1.01, 0.99, 1.0]):  # 1 warm-up, then 6 steady
        cumulative += seconds
        decisions.append(stop(Window(end_iter=20 * (i + 1), seconds=seconds, cumulative_seconds=cumulative,
                                     warmup=i == 0)))
    # six steady windows: interval [0.98, 1.02] -> half-width 0.02 / median 1.0 = 2 %
    assert decisions == [False] * 6 + [True] and stop.reason == "precision"


def test_auto_stop_judges_the_slowest_rank_and_stops_at_max_seconds():
    """This rank saw 1 s windows; the slowest rank's clock (the all-reduced maximum) says 10 s each."""
    stop = AutoStop(precision_pct=0.01, max_seconds=25.0, slowest=lambda x: 10 * x)
    decisions = [stop(Window(end_iter=20 * i, seconds=1.0, cumulative_seconds=float(i), warmup=i == 1))
                 for i in range(1, 4)]
    assert decisions == [False, False, True] and stop.reason == "max_seconds"
    assert stop.steady == [10.0, 10.0]


def test_time_spent_deciding_is_in_no_window():
    """Edges at 1, 2 s; each decision takes 0.5 s (clock reads 1.5, 2.5): windows 1 + 1, cumulative 2."""
    fake = FakeClock([0.0, 1.0, 1.5, 2.5, 3.0])
    wc = WindowClock(fake.sync, warmup_windows=0, clock=fake.clock)
    wc.start()
    first = wc.edge(10, decide=lambda w: False)
    second = wc.edge(20, decide=lambda w: True)
    assert (first.seconds, second.seconds) == (1.0, 1.0)
    assert (first.cumulative_seconds, second.cumulative_seconds) == (1.0, 2.0)
    assert wc.stop is True


def test_trainer_with_auto_iterations_stops_where_decide_says():
    spec = resolve(AmpConfig(level="O0"), "cpu")
    precision = amp_plugin(spec)
    torch.manual_seed(0)
    model, optimizer = prepare(precision, TinyCNN(num_classes=10), lambda p: torch.optim.SGD(p, lr=0.1))
    clock = WindowClock(lambda: None, warmup_windows=0)
    windows = train(model, optimizer, precision, SyntheticSource([tiny_batch()]), clock, None, 5,
                    decide=lambda w: w.end_iter == 15)
    assert [w.end_iter for w in windows] == [5, 10, 15]
