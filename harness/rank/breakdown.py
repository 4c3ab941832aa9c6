"""Where a profiled window's time went: its trace (Chrome/Perfetto JSON, as torch.profiler exports it)
partitioned into compute, communication, data wait, optimizer step and other.

Every instant of the window (the `harness.window` span) gets exactly one part, so the parts add up to the
span. Which part, by priority:

- device view (a trace with GPU kernels): a compute or optimizer kernel running -> compute / optimizer; else a
  communication kernel (NCCL; DataParallel's copies launched from Broadcast/Scatter/Gather) -> communication
  (exposed: nothing else was running); else the batch's host-to-device copy -> data wait; else the device was
  idle and the training thread decides, as in the host view.
- host view (CPU runs; and GPU time with an idle device): what the training thread was in, innermost-first
  by kind: a collective (gloo/NCCL calls, DataParallel's functions) -> communication; the optimizer's step or
  zero_grad -> optimizer; the DataLoader's next -> data wait; any other op -> compute; in no op while a
  collective was in flight on another thread (gloo runs them on threads of its own) -> communication (the
  thread waits for it); in no op at all -> other (Python, idle).

Communication that ran while something else was being done is overlapped (DDP's all-reduce under backward):
`communication_total_s` is all the time a collective was in flight (in the device view: a communication kernel
running) or the thread was blocked in one, `communication_overlapped_s` the part of it classified as something
else."""

from __future__ import annotations

import heapq
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

PARTS = ("compute", "communication", "data_wait", "optimizer", "other")
SPAN = "harness.window"
HOST_CATS = ("cpu_op", "user_annotation")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
COMM = re.compile(r"^(gloo:|nccl:|c10d::|record_param_comms)|nccl|"
                  r"^(autograd::engine::evaluate_function: )?(Broadcast|Scatter|Gather|ReduceAddCoalesced)(Backward)?$",
                  re.IGNORECASE)


def host_kind(name: str) -> str:
    """What a host op or annotation is, by the name torch gives it."""
    if COMM.search(name):
        return "comm"
    if name.startswith("Optimizer."):  # torch.optim: `Optimizer.step#SGD.step`, `Optimizer.zero_grad#...`
        return "optimizer"
    if name.startswith("enumerate(DataLoader)") or "pin_memory" in name:  # `enumerate(DataLoader)#..__next__`;
        return "data"  # the DataLoader's pinning thread
    return "compute"


HOST_PRIORITY = ("comm", "optimizer", "data", "compute")


def _strongest(kinds: Counter[str]) -> str | None:
    return next((k for k in HOST_PRIORITY if kinds[k] > 0), None)


def _kinds_at(intervals: list[tuple[float, float, str]], times: Sequence[float]) -> list[Counter[str]]:
    """For each time (ascending), the kinds of the intervals covering it."""
    intervals = sorted(intervals)
    active: Counter[str] = Counter()
    ends: list[tuple[float, str]] = []
    out, i = [], 0
    for t in times:
        while i < len(intervals) and intervals[i][0] <= t:
            start, end, kind = intervals[i]
            heapq.heappush(ends, (end, kind))
            active[kind] += 1
            i += 1
        while ends and ends[0][0] < t:
            _, kind = heapq.heappop(ends)
            active[kind] -= 1
        out.append(Counter(active))
    return out


def lanes(events: Iterable[dict[str, Any]]) -> tuple[tuple[float, float], list[tuple[float, float, str]], bool]:
    """(span, [(start, end, lane)], has_device) from the trace's events; times in microseconds."""
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    span_event = next((e for e in complete if e.get("name") == SPAN), None)
    if span_event is None:
        raise ValueError(f"the trace has no '{SPAN}' annotation: not a harness window")
    main = span_event.get("tid")
    span = (float(span_event["ts"]), float(span_event["ts"]) + float(span_event["dur"]))
    per_thread: dict[Any, list[tuple[float, float, str]]] = {}
    result: list[tuple[float, float, str]] = []
    for e in complete:
        if e.get("cat") not in HOST_CATS or e is span_event:
            continue
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        kind = host_kind(str(e.get("name", "")))
        per_thread.setdefault(e.get("tid"), []).append((start, end, kind))
        if e.get("tid") == main:
            result.append((start, end, f"host:{kind}"))
        elif kind in ("comm", "compute"):
            result.append((start, end, f"bg:{kind}"))
    device = [e for e in complete if e.get("cat") in DEVICE_CATS]
    launches = {e["args"]["correlation"]: e for e in complete
                if e.get("cat") in RUNTIME_CATS and "correlation" in (e.get("args") or {})}
    launched_from = _launch_kinds(device, launches, per_thread)
    for e in device:
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        result.append((start, end, f"dev:{device_kind(str(e.get('name', '')), launched_from.get(id(e)))}"))
    return span, result, bool(device)


def device_kind(name: str, host: str | None) -> str:
    """A kernel or copy's kind: NCCL's by name, DataParallel's copies by the op that launched them."""
    if "nccl" in name.lower() or host == "comm":
        return "comm"
    if host == "optimizer":
        return "optimizer"
    if host == "data" or name.startswith("Memcpy HtoD"):
        return "data"
    return "compute"


def _launch_kinds(device: list[dict[str, Any]], launches: dict[Any, dict[str, Any]],
                  per_thread: dict[Any, list[tuple[float, float, str]]]) -> dict[int, str]:
    """id(device event) -> the kind of the host op it was launched from (its runtime call's thread and time)."""
    queries: dict[Any, list[tuple[float, int]]] = {}
    for e in device:
        launch = launches.get((e.get("args") or {}).get("correlation"))
        if launch is not None:
            queries.setdefault(launch.get("tid"), []).append((float(launch["ts"]), id(e)))
    kinds: dict[int, str] = {}
    for tid, asked in queries.items():
        asked.sort()
        for (_, key), covering in zip(asked, _kinds_at(per_thread.get(tid, []), [t for t, _ in asked]), strict=True):
            strongest = _strongest(covering)
            if strongest is not None:
                kinds[key] = strongest
    return kinds


def classify(active: Counter[str], device_view: bool) -> str:
    """The one part an instant belongs to, from the lanes active then (priorities in the module's docstring)."""
    if device_view:
        for lane, part in (("dev:optimizer", "optimizer"), ("dev:compute", "compute"), ("dev:comm", "communication"),
                           ("dev:data", "data_wait")):
            if active[lane] > 0:
                return part
    for lane, part in (("host:comm", "communication"), ("host:optimizer", "optimizer"), ("host:data", "data_wait"),
                       ("host:compute", "compute"), ("bg:comm", "communication"), ("bg:compute", "compute")):
        if active[lane] > 0:
            return part
    return "other"


def breakdown_of_events(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    span, intervals, device_view = lanes(events)
    points: list[tuple[float, int, str]] = []
    for start, end, lane in intervals:
        start, end = max(start, span[0]), min(end, span[1])
        if end > start:
            points += [(start, 1, lane), (end, -1, lane)]
    points += [(span[0], 0, ""), (span[1], 0, "")]
    points.sort(key=lambda p: (p[0], p[1]))
    parts = dict.fromkeys(PARTS, 0.0)
    comm_total = 0.0  # a collective in flight (on the device, in the device view), or the thread blocked in one
    comm_lanes = ("dev:comm",) if device_view else ("host:comm", "bg:comm")
    active: Counter[str] = Counter()
    previous = span[0]
    for t, step, lane in points:
        if t > previous:
            seconds = (t - previous) / 1e6
            part = classify(active, device_view)
            parts[part] += seconds
            if part == "communication" or any(active[k] > 0 for k in comm_lanes):
                comm_total += seconds
            previous = t
        if step:
            active[lane] += step
    span_s = (span[1] - span[0]) / 1e6
    return {"view": "device" if device_view else "host", "span_s": span_s, "parts_s": parts,
            "shares": {k: (v / span_s if span_s > 0 else None) for k, v in parts.items()},
            "communication_total_s": comm_total,
            "communication_overlapped_s": max(0.0, comm_total - parts["communication"])}


def breakdown(trace: Path) -> dict[str, Any]:
    """The breakdown of the profiled window in a trace file torch.profiler exported."""
    data = json.loads(Path(trace).read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    return breakdown_of_events(events)
