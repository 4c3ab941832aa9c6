"""results.json's `machine`: how busy the machine was while the run was timed. Run-to-run noise on a shared
machine comes from what else runs on it, so every run records the CPU time that processes outside the run took
during its steady windows (the machine's busy CPU time minus the run's own: the launcher and every process
below it), the load average just before it started and, on GPUs, the largest SM utilisation another PID had
(NVML). A run where others took BUSY_SHARE of the machine or more is `busy`: the report says so and its
verdict does not rest on it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import psutil

from harness.launch.activity import counter_at

BUSY_SHARE = 0.2  # of all cores, taken by other processes during the steady windows (timing.busy_share)
# Steady windows shorter than this in all tell nothing about others' share: CPU-time counters tick every 10 ms and
# are read every 0.1 s (runner.LOAD_INTERVAL_S), so a 20-ms window's share is the tick's noise. Seen: a tiny MLP
# whose 20 iterations took 22 ms was called busy at "0.5 of 2 cores" on an idle machine.
MIN_JUDGED_S = 1.0
BUSY_GPU_PCT = 10.0  # another PID's SM utilisation on the run's GPUs


def busy_cpu_seconds() -> float:
    """CPU seconds the machine has spent not idle since boot (guest time is inside user time: not added)."""
    t = psutil.cpu_times()
    return sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))


def tree_cpu_seconds(root: psutil.Process, seen: dict[int, float]) -> float:
    """CPU seconds of `root` and every process below it, and of those that were below it and have ended (their
    last reading, kept in `seen`): the run's own time never drops when its workers exit."""
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            seen[proc.pid] = t.user + t.system
        except psutil.Error:
            continue
    return sum(seen.values())


class LoadReadings:
    """(Unix time, machine busy CPU s, run CPU s) every `interval_s` on a daemon thread, from before the
    workers start to after they end."""

    def __init__(self, root_pid: int, interval_s: float) -> None:
        self._root = psutil.Process(root_pid)
        self.interval_s = interval_s
        self.readings: list[tuple[float, float, float]] = []
        self._seen: dict[int, float] = {}
        self.load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load-readings", daemon=True)

    def start(self) -> LoadReadings:
        self._read()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def _read(self) -> None:
        try:
            self.readings.append((time.time(), busy_cpu_seconds(), tree_cpu_seconds(self._root, self._seen)))
        except psutil.Error:
            pass


def machine_section(readings: Sequence[tuple[float, float, float]], spans: Sequence[tuple[float, float]],
                    cores: int, load_before: float | None, others_gpu_pct: float | None = None,
                    busy_share: float = BUSY_SHARE) -> dict[str, Any]:
    """Others' CPU seconds over the steady `spans` (each counter read linearly between the readings either
    side), and whether that, or another PID on the run's GPUs, makes the run `busy`."""
    machine = [(at, busy) for at, busy, _ in readings]
    own = [(at, run) for at, _, run in readings]
    others, seconds = 0.0, 0.0
    for start, end in spans:
        ends = [counter_at(machine, end), counter_at(machine, start), counter_at(own, end), counter_at(own, start)]
        if any(v is None for v in ends):
            others, seconds = float("nan"), 0.0
            break
        busy_end, busy_start, run_end, run_start = ends  # type: ignore[misc]
        others += max(0.0, (busy_end - busy_start) - (run_end - run_start))
        seconds += end - start
    known = seconds > 0
    section: dict[str, Any] = {"cores": cores, "load_before": None if load_before is None else round(load_before, 2),
                               "others_cpu_s": round(others, 3) if known else None,
                               "windows_s": round(seconds, 3) if known else None,
                               "others_gpu_util_pct": others_gpu_pct, "busy": False, "reason": None}
    reasons = []
    if known and seconds >= MIN_JUDGED_S and busy_share < 1 and others / seconds >= busy_share * cores:
        reasons.append(f"other processes used {others / seconds:.1f} of {cores} cores during its windows")
    if others_gpu_pct is not None and others_gpu_pct >= BUSY_GPU_PCT:
        reasons.append(f"another process used {others_gpu_pct:.0f} % of a GPU's SMs")
    if reasons:
        section.update(busy=True, reason="; ".join(reasons))
    return section
