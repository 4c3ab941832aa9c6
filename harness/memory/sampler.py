"""Memory per device and per process, sampled from the parent on a thread of its own.

GPUs are read through NVML (what nvidia-smi shows, other users' processes included, hence the
baseline taken before the run); CPU workers through psutil's resident set size. DataLoader workers
(children of a rank) are read through psutil on either, as host memory (`role: data`). On GPUs the same reads
take utilisation, SM clock, power and the energy counter, each recorded as unavailable (None) where the GPU or
driver does not support it, never as 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import psutil

MIB = 2**20


@dataclass
class Sample:
    per_device: dict[str, float] = field(default_factory=dict)  # device label -> MiB used
    # (pid, device) -> MiB; None where the driver hides a process's figure (MIG without privileges, some
    # containers): known to be there, amount unknown, never 0
    per_process: dict[tuple[int, str], float | None] = field(default_factory=dict)
    at: float = 0.0  # Unix time of the read
    # device label -> {"utilization_pct", "sm_clock_mhz", "power_w", "energy_j"}: None where unsupported
    activity: dict[str, dict[str, float | None]] = field(default_factory=dict)


class MemorySource(Protocol):
    name: str

    def read(self) -> Sample: ...

    def close(self) -> None: ...


class NvmlSource:
    """Used memory per GPU and per PID (nvmlDeviceGetComputeRunningProcesses) for the run's GPUs.

    Each GPU is opened by its CUDA_VISIBLE_DEVICES token: an index by index, a UUID or MIG name by UUID,
    so the GPU read is the GPU the workers use. Per-process figures are extra: when NVML refuses them
    (NO_PERMISSION under MIG, a driver older than the binding's `_v3` query) the per-GPU figures go on
    and `process_warning` says why the PIDs are missing."""

    name = "nvml"

    def __init__(self, physical_ids: Sequence[int], nvml: ModuleType | None = None,
                 tokens: Sequence[str] | None = None, host: PsutilSource | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if nvml is None:
            import pynvml as nvml  # lazy: optional at run time, absent data just means no NVML figures
        self._nvml = nvml
        nvml.nvmlInit()
        tokens = list(tokens) if tokens else [str(i) for i in physical_ids]
        self._handles = {f"cuda:{i}": self._open(token) for i, token in zip(physical_ids, tokens, strict=True)}
        self._query_processes = nvml.nvmlDeviceGetComputeRunningProcesses
        self.process_warning: str | None = None
        self._host, self._clock = host, clock
        self.unsupported: dict[str, str] = {}  # "cuda:0 energy_j" -> NVML's reason; not asked again
        self._seen: dict[str, int] = {}  # per GPU, the newest process-utilisation sample's timestamp (µs)

    ACTIVITY = ("utilization_pct", "sm_clock_mhz", "power_w", "energy_j")

    def _open(self, token: str) -> Any:
        if token.isdigit():
            return self._nvml.nvmlDeviceGetHandleByIndex(int(token))
        return self._nvml.nvmlDeviceGetHandleByUUID(token)

    def read(self) -> Sample:
        sample = self._host.read() if self._host is not None else Sample()  # host memory: data workers
        sample.per_process = {(pid, "host"): mib for (pid, _), mib in sample.per_process.items()}
        sample.at = self._clock()
        for label, handle in self._handles.items():
            sample.per_device[label] = self._nvml.nvmlDeviceGetMemoryInfo(handle).used / MIB
            for proc in self._processes(handle):
                used = proc.usedGpuMemory  # None where the driver hides it (pynvml maps NOT_AVAILABLE to None)
                sample.per_process[(proc.pid, label)] = None if used is None else used / MIB
            sample.activity[label] = {key: self._activity(label, key, handle) for key in self.ACTIVITY}
            sample.activity[label]["others_sm_pct"] = self._others_utilization(label, handle)
        return sample

    def _others_utilization(self, label: str, handle: Any) -> float | None:
        """The largest SM utilisation (%) a PID outside the run had on this GPU since the last reading:
        nvmlDeviceGetProcessUtilization's samples, less the run's processes (the host tree: launcher, ranks,
        data workers). None where NVML gives none or there is no host tree to tell the run's PIDs by."""
        key = f"{label} others_sm_pct"
        if key in self.unsupported or self._host is None:
            return None
        since = self._seen.get(label, 0)
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except self._nvml.NVMLError_NotFound:  # no sample since `since`: nobody ran a kernel
            return 0.0
        except self._nvml.NVMLError as error:
            if getattr(error, "value", None) == self._nvml.NVML_SUCCESS:  # no sample at all (count 0)
                return 0.0
            self.unsupported[key] = str(error)
            return None
        own = self._host.pids()
        self._seen[label] = max([since, *(s.timeStamp for s in samples)])
        return float(max((s.smUtil for s in samples if s.pid not in own), default=0))

    def _activity(self, label: str, key: str, handle: Any) -> float | None:
        """One activity figure in plain units; None (and never asked again) where NVML says it cannot give it
        (NVMLError_NotSupported on GPUs without the counter, FunctionNotFound on old drivers, NoPermission)."""
        if f"{label} {key}" in self.unsupported:
            return None
        nvml = self._nvml
        try:
            if key == "utilization_pct":
                return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            if key == "sm_clock_mhz":
                return float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
            if key == "power_w":
                return nvml.nvmlDeviceGetPowerUsage(handle) / 1000  # milliwatts
            return nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000  # millijoules since the driver loaded
        except nvml.NVMLError as error:
            self.unsupported[f"{label} {key}"] = str(error)
            return None

    def _processes(self, handle: Any) -> list[Any]:
        if self.process_warning is not None:
            return []
        try:
            return self._query_processes(handle)
        except self._nvml.NVMLLibraryMismatchError:
            # pynvml 13 calls only `..._v3`; an older driver lacks it: its `_v2` holds the same fields
            self._query_processes = self._nvml.nvmlDeviceGetComputeRunningProcesses_v2
            return self._processes(handle)
        except self._nvml.NVMLError as error:
            self.process_warning = f"NVML gives no per-process memory here ({error}); per-GPU figures only"
            return []

    def describe(self) -> dict[str, Any]:
        nvml = self._nvml
        names = [_text(nvml.nvmlDeviceGetName(h)) for h in self._handles.values()]
        return {"driver": _text(nvml.nvmlSystemGetDriverVersion()), "gpu_names": names}

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class PsutilSource:
    """Resident memory of the launcher and every process below it (CPU workers are processes).

    Listing the process tree reads /proc of every process on the machine (~0.4 ms, holding the GIL),
    so it is done every 0.2 s (workers forked from the fork server start within that, and a short run's
    ranks must not be missed); each sample reads only the known processes' memory (~5 µs)."""

    name = "psutil"
    RELIST_S = 0.2

    def __init__(self, root_pid: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._root = psutil.Process(root_pid)
        self._clock = clock
        self._procs: list[psutil.Process] = []
        self._listed_at = float("-inf")

    def read(self) -> Sample:
        if self._clock() - self._listed_at >= self.RELIST_S:
            self._procs = [self._root, *self._root.children(recursive=True)]
            self._listed_at = self._clock()
        sample = Sample()
        for proc in self._procs:
            try:
                sample.per_process[(proc.pid, "cpu")] = proc.memory_info().rss / MIB
            except psutil.Error:
                continue  # ended since it was listed
        return sample

    def pids(self) -> set[int]:
        """The run's processes as last listed."""
        return {proc.pid for proc in self._procs}

    def close(self) -> None:
        pass


class MemoryTracker:
    """Peaks and the pre-run baseline. Pure bookkeeping, fed by the sampler thread or by tests."""

    def __init__(self) -> None:
        self.baseline: Sample | None = None
        self.peak_device: dict[str, float] = {}
        self.peak_process: dict[tuple[int, str], float | None] = {}
        self.activity: list[tuple[float, dict[str, dict[str, float | None]]]] = []  # (Unix time, per device)
        self.samples = 0

    def add(self, sample: Sample) -> None:
        if sample.activity:
            self.activity.append((sample.at, sample.activity))
        if self.baseline is None:
            self.baseline = sample
            return
        self.samples += 1
        for key, mib in sample.per_device.items():
            self.peak_device[key] = max(mib, self.peak_device.get(key, 0.0))
        for key, value in sample.per_process.items():
            known = self.peak_process.get(key)
            self.peak_process[key] = value if known is None else known if value is None else max(value, known)


class MemorySampler:
    """Reads `source` every `interval_s` on a daemon thread; the first read is the baseline."""

    def __init__(self, source: MemorySource, interval_s: float) -> None:
        self.source, self.interval_s = source, interval_s
        self.source_name = source.name
        self.tracker = MemoryTracker()
        self.warning: str | None = None
        self.unsupported: dict[str, str] = {}  # NVML activity figures the GPUs could not give, and why
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)

    def start(self) -> MemorySampler:
        self._read()  # baseline, before any worker exists
        self._thread.start()
        return self

    def stop(self) -> MemoryTracker:
        self._stop.set()
        self._thread.join()
        self._read()
        self.source.close()
        process_warning = getattr(self.source, "process_warning", None)
        if process_warning and self.warning is None:
            self.warning = process_warning
        self.unsupported = dict(getattr(self.source, "unsupported", {}))
        return self.tracker

    def findings(self) -> SamplerFindings:
        """What the sampler saw, as plain data (to send to another process)."""
        return SamplerFindings(self.tracker, self.source_name, self.warning)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s) and self.warning is None:
            self._read()

    def _read(self) -> None:
        if self.warning is not None:
            return
        try:
            self.tracker.add(self.source.read())
        except Exception as error:  # a flaky driver must not end the run: keep what was seen
            self.warning = f"memory sampling via {self.source.name} stopped: {error}"


@dataclass(frozen=True)
class SamplerFindings:
    tracker: MemoryTracker
    source_name: str
    warning: str | None


@dataclass(frozen=True)
class RankProcess:
    rank: int
    pid: int
    device: str  # the device label the rank drives
    host: str = ""
    rss_at_start_mib: float | None = None  # the rank's resident memory before it built anything (CPU baseline)
    data_pids: tuple[int, ...] = ()  # its DataLoader workers (each noted its PID when it started)


def summarize(tracker: MemoryTracker, source: str, devices: Sequence[str], ranks: Iterable[RankProcess],
              launcher_pid: int) -> dict[str, Any]:
    """The results file's `memory` section: peaks per device and per PID, with ranks attached.

    NVML: PIDs already on a GPU before the run are other users' and are left out. psutil: only the
    worker processes count (the launcher too for one-process strategies, which run inside it). On either, a
    rank's DataLoader workers (the PIDs they noted) are `role: data`, on the rank's device, in host memory; on
    CPU their memory counts towards the rank's device.
    """
    rank_of_pid = {r.pid: r for r in ranks}
    data_of_pid = {pid: r for r in ranks for pid in r.data_pids}
    baseline = tracker.baseline or Sample()
    before = {pid for pid, _ in baseline.per_process}
    per_process = []
    for (pid, device), peak in sorted(tracker.peak_process.items()):
        rank = rank_of_pid.get(pid)
        parent = data_of_pid.get(pid)
        if rank is None and parent is not None and device in ("cpu", "host"):
            per_process.append({"pid": pid, "rank": parent.rank, "device": parent.device,
                                "peak_mib": None if peak is None else round(peak, 1), "role": "data",
                                "host": parent.host})
            continue
        if device == "host":  # NVML runs: host memory is read for the data workers only
            continue
        if source == "psutil":
            if rank is None:
                continue
            device = rank.device
        elif rank is None and pid in before and pid != launcher_pid:
            continue
        role = "rank" if rank is not None else ("launcher" if pid == launcher_pid else "other")
        per_process.append({"pid": pid, "rank": None if rank is None else rank.rank, "device": device,
                            "peak_mib": None if peak is None else round(peak, 1), "role": role,
                            "host": rank.host if rank is not None else ""})
    if source == "psutil":
        per_device = _devices_from_processes(per_process, baseline, rank_of_pid, devices)
    else:
        _match_host_pids(per_process, rank_of_pid)
        per_device = [{"device": d, "peak_mib": round(tracker.peak_device.get(d, 0.0), 1),
                       "baseline_mib": round(baseline.per_device.get(d, 0.0), 1)} for d in devices]
    return {"source": source, "samples": tracker.samples, "per_device": per_device, "per_process": per_process}


def _match_host_pids(per_process: list[dict[str, Any]], rank_of_pid: Mapping[int, RankProcess]) -> None:
    """Inside a container NVML reports the host's PIDs, which no rank knows as its own. Where a rank's own PID
    is nowhere in NVML's list and exactly one PID new to the GPU holds memory on that rank's device, that PID is
    the rank's (as `pid`, NVML's in `nvml_pid`, on every device it holds). PIDs left over while some rank is
    still unseen are `role: unmatched`: the run cannot say whose they are, and does not call them strangers."""
    seen = {p["pid"] for p in per_process if p["role"] == "rank"}
    unseen = [r for r in rank_of_pid.values() if r.pid not in seen]
    if not unseen:
        return
    strangers = [p for p in per_process if p["role"] == "other"]
    host_pid_of: dict[int, RankProcess] = {}
    for rank in unseen:
        on_device = {p["pid"] for p in strangers if p["device"] == rank.device}
        owners = [r for r in unseen if r.device == rank.device]
        if len(on_device) == 1 and len(owners) == 1:
            host_pid_of[next(iter(on_device))] = rank
    for p in strangers:
        rank = host_pid_of.get(p["pid"])
        if rank is not None:
            p.update(nvml_pid=p["pid"], pid=rank.pid, rank=rank.rank, role="rank", host=rank.host)
        else:
            p["role"] = "unmatched"


def _devices_from_processes(per_process: list[dict[str, Any]], baseline: Sample,
                            rank_of_pid: Mapping[int, RankProcess], devices: Sequence[str]) -> list[dict[str, Any]]:
    """On CPU a worker process is the "device": its RSS peak, and as baseline its RSS when the rank started
    (interpreter and libraries loaded, nothing built), whether it runs inside the launcher or in a process
    of its own; the sampler's pre-run reading where the rank did not say."""
    rows = []
    for device in devices:
        procs = [p for p in per_process if p["device"] == device]
        base = sum(_process_baseline(p["pid"], rank_of_pid, baseline) for p in procs)
        rows.append({"device": device, "peak_mib": round(sum(p["peak_mib"] for p in procs), 1),
                     "baseline_mib": round(base, 1)})
    return rows


def _process_baseline(pid: int, rank_of_pid: Mapping[int, RankProcess], baseline: Sample) -> float:
    rank = rank_of_pid.get(pid)
    if rank is not None and rank.rss_at_start_mib is not None:
        return rank.rss_at_start_mib
    return baseline.per_process.get((pid, "cpu")) or 0.0


def open_source(accelerator: str, physical_ids: Sequence[int], launcher_pid: int, tokens: Sequence[str] = (),
                nvml_factory: Callable[..., MemorySource] = NvmlSource) -> tuple[MemorySource | None, str | None]:
    """The best source for the accelerator, or (None, warning) when NVML cannot be had."""
    if accelerator != "cuda":
        return PsutilSource(launcher_pid), None
    try:
        return nvml_factory(physical_ids, tokens=tokens, host=PsutilSource(launcher_pid)), None
    except Exception as error:  # missing package, no driver, permissions
        return None, f"NVML unavailable ({error}); GPU memory falls back to torch's allocator peaks"
