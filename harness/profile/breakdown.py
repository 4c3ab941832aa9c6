"""Where a profiled window's time went: its trace (Chrome/Perfetto JSON, as torch.profiler exports it)
partitioned into compute, communication, data wait, optimizer step and other.

Every instant of the window (the `harness.window` span) gets exactly one part, so the parts add up to the
span. Which part, by priority:

- device view (a trace with GPU kernels): a compute or optimizer kernel running -> compute / optimizer; else a
  communication kernel (NCCL; DataParallel's copies launched from Broadcast/Scatter/Gather) -> communication
  (exposed: nothing else was running); else the batch's host-to-device copy -> data wait; else the device was
  idle and the training thread decides, as in the host view.
- host view (CPU runs; and GPU time with an idle device): what each thread was doing. A thread is in a
  collective (gloo/NCCL calls, DataParallel's functions) -> communication, in the optimizer's step or zero_grad
  -> optimizer, in the DataLoader's next -> data wait, whatever runs under them (the whole scope counts); else
  it computes only where its innermost event is an operator (`cpu_op`): a scope with nothing under it at that
  instant (a `record_function` annotation such as `DistributedDataParallel.forward` or `FSDP::all_gather (..)`,
  the autograd engine's `evaluate_function: ..` wrapper, `PythonSubclass`) runs no operator: the thread is in
  Python or blocked (a comm hook's `future.wait()`, FSDP's wait for its all-gather), like a thread in no op at
  all. Then, by priority: the training thread in a collective -> communication; in the optimizer ->
  optimizer; in the DataLoader -> data wait; running an operator -> compute; else a collective in flight on
  another thread (gloo runs them on threads of its own) -> communication (exposed: the thread waits for it);
  else another thread running an operator -> compute; else -> other (Python, idle).

Communication that ran while something else was being done is overlapped (DDP's all-reduce under backward):
`communication_total_s` is all the time a collective was in flight (in the device view: a communication kernel
running) or the thread was blocked in one, `communication_overlapped_s` the part of it classified as something
else: an operator (a kernel, in the device view) actually running, or the optimizer's or the DataLoader's scope
(they rank above it). A thread blocked in a bare scope is waiting, not overlapping."""

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
COMM = re.compile(r"^(gloo:|nccl:|c10d::|_?c10d_functional::|record_param_comms|aten::wait$)|nccl|"
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
SCOPE_KINDS = ("comm", "optimizer", "data")  # kinds a whole scope has, whatever runs (or waits) under it
# cpu_ops that only wrap others: the autograd engine evaluating a node (its own time: hooks, e.g. a comm hook
# waiting on its future), a tensor subclass's dispatch (FSDP2's DTensor)
WRAPPER = re.compile(r"^(autograd::engine::evaluate_function: |PythonSubclass$)")


def runs_operator(cat: str, name: str) -> bool:
    """Whether a thread whose innermost event is this one is running an operator (not a scope around none)."""
    return cat == "cpu_op" and not WRAPPER.match(name)


def thread_states(events: list[tuple[float, float, str, bool]]) -> list[tuple[float, float, str]]:
    """One thread's (start, end, state) from its (start, end, kind, runs_operator) events: a scope kind
    (comm/optimizer/data) where any event covering the instant has it, else "compute" where the innermost one
    runs an operator, else "scope" (inside scopes only: Python or blocked). Times in no event are left out."""
    order = sorted((i for i, e in enumerate(events) if e[1] > e[0]),  # an instant (dur 0) covers no time
                   key=lambda i: (events[i][0], -events[i][1], events[i][3]))
    rank = {i: n for n, i in enumerate(order)}  # innermost = the latest to start; on a tie the shorter, then
    # the operator (a scope and the op in it can share both ends at the trace's µs resolution)
    points = sorted([(events[i][0], 1, i) for i in order] + [(events[i][1], -1, i) for i in order],
                    key=lambda p: (p[0], p[1]))
    active: dict[int, None] = {}
    scope: Counter[str] = Counter()
    out: list[tuple[float, float, str]] = []
    previous = None
    for t, step, i in points:
        if active and previous is not None and t > previous:
            state = next((k for k in SCOPE_KINDS if scope[k] > 0), None)
            if state is None:
                state = "compute" if events[max(active, key=rank.__getitem__)][3] else "scope"
            if out and out[-1][2] == state and out[-1][1] == previous:
                out[-1] = (out[-1][0], t, state)
            else:
                out.append((previous, t, state))
        previous = t
        if step > 0:
            active[i] = None
            scope[events[i][2]] += 1
        else:
            active.pop(i, None)
            scope[events[i][2]] -= 1
    return out


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
    flagged: dict[Any, list[tuple[float, float, str, bool]]] = {}
    for e in complete:
        if e.get("cat") not in HOST_CATS or e is span_event:
            continue
        start, end, name = float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e.get("name", ""))
        kind = host_kind(name)
        per_thread.setdefault(e.get("tid"), []).append((start, end, kind))
        flagged.setdefault(e.get("tid"), []).append((start, end, kind, runs_operator(str(e.get("cat")), name)))
    result: list[tuple[float, float, str]] = []
    for tid, events_of_thread in flagged.items():
        for start, end, state in thread_states(events_of_thread):
            if tid == main and state != "scope":
                result.append((start, end, f"host:{state}"))
            elif tid != main and state in ("comm", "compute"):
                result.append((start, end, f"bg:{state}"))
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
    """The one part an instant belongs to, from the lanes active then (priorities in the module's docstring).
    host:compute / bg:compute are lanes of a thread running an operator, never of one inside a bare scope."""
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
