"""profile=true: torch.profiler over one window per rank, the first after warm-up.

The profiler is started at the edge before that window and stopped at its own edge, both in the clock's
excluded slot (like iterations=auto's decision), so starting and stopping it costs no window any time; the
profiled window itself carries the profiler's per-op cost and is marked `profiled`, left out of every
steady-state figure. A barrier after starting and after stopping lines the ranks up again, so no rank's next
window holds a neighbour's profiler start-up as a wait in a collective. An annotation `harness.window` spans
the window in the trace: the breakdown classifies exactly that span."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.core.timing import Window

log = logging.getLogger(__name__)
SPAN = "harness.window"
KINETO_QUIET = "6"  # above kineto's every level: its highest, USDT (5), is the "profiler_start/stop" notes


def quiet_kineto(accelerator: str) -> None:
    """Without a GPU, what kineto writes to a process's stderr from C++ says nothing a user can act on: an ERROR
    that it found no GPU ("gpuGetDeviceCount failed with code 35") and a USDT line at every profiler start and
    stop (the CPU ranks' tensor peak, profile=true). Kineto reads KINETO_LOG_LEVEL when a process's first profile
    starts, and started processes inherit it: set before either. On a GPU its errors (CUPTI's) matter, and a
    user's own KINETO_LOG_LEVEL wins."""
    if accelerator != "cuda":
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)


class WindowProfiler:
    def __init__(self, window_index: int, accelerator: str, barrier: Callable[[], None]) -> None:
        self.window_index, self._barrier = window_index, barrier
        quiet_kineto(accelerator)  # for a rank started elsewhere (torchrun); run.py has set it already
        activities = [torch.profiler.ProfilerActivity.CPU]
        if accelerator == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._activities = activities
        self._profiler: Any = None
        self._span: Any = None
        self._closed = 0
        self.window: Window | None = None  # the profiled window, once it is closed

    def at_edge(self, window: Window) -> None:
        """Called in the clock's excluded slot after every window edge."""
        self._closed += 1
        if self._closed == self.window_index:  # the next window is the profiled one
            self._profiler = torch.profiler.profile(activities=self._activities)
            self._profiler.start()
            self._barrier()
            self._span = torch.profiler.record_function(SPAN)
            self._span.__enter__()
        elif self._closed == self.window_index + 1 and self._profiler is not None:
            self._span.__exit__(None, None, None)
            self._profiler.stop()
            self.window = window
            self._barrier()

    def finish(self, trace: Path) -> Path | None:
        """After training: the Chrome/Perfetto trace of the profiled window, or None if the run stopped before
        that window closed (the profiler is stopped, nothing is written)."""
        if self._profiler is None:
            return None
        if self.window is None:
            self._span.__exit__(None, None, None)
            self._profiler.stop()
            return None
        trace.parent.mkdir(parents=True, exist_ok=True)
        self._profiler.export_chrome_trace(str(trace))
        self._profiler = None
        return trace


def at_edges(profiler: WindowProfiler | None,
             decide: Callable[[Window], bool] | None) -> Callable[[Window], bool] | None:
    """What runs in the clock's excluded slot at every edge: the profiler's start/stop, then `decide`."""
    if profiler is None:
        return decide

    def at_edge(window: Window) -> bool:
        profiler.at_edge(window)
        return decide(window) if decide is not None else False

    return at_edge
