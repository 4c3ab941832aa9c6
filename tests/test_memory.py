"""harness.memory.sampler: NVML bookkeeping against a fake NVML, psutil against real child processes, the sampler."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from harness.core.results import ProcessMemory
from harness.memory.imbalance import _pid_layout
from harness.memory.sampler import (
    MIB,
    MemorySampler,
    MemoryTracker,
    NvmlSource,
    PsutilSource,
    RankProcess,
    Sample,
    open_source,
    summarize,
)


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int | None  # noqa: N815 (NVML's name)


@dataclass
class FakeMemoryInfo:
    """pynvml's c_nvmlMemory_t: `_fields_ = [('total', c_ulonglong), ('free', c_ulonglong), ('used', c_ulonglong)]`
    (bytes; `free` is `total - used` less what the driver reserves, here nothing)."""

    used: int
    total: int = 80 * 2**30

    @property
    def free(self) -> int:
        return self.total - self.used


class NVMLError(Exception):
    """pynvml.NVMLError: made from NVML's return code, `str()` is NVML's message for it (pynvml.py:
    `_errcode_to_string = {... NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_NO_PERMISSION: "Insufficient
    Permissions", ...}`), and each code has its subclass (`_extractNVMLErrorsAsClasses`: "NVML_ERROR_NOT_SUPPORTED
    will be turned into NVMLError_NotSupported")."""

    MESSAGES = {3: "Not Supported", 4: "Insufficient Permissions", 13: "Function Not Found"}

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self.MESSAGES.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's name)
    def __init__(self) -> None:
        super().__init__(3)  # NVML_ERROR_NOT_SUPPORTED: e.g. the energy counter before Volta


class NVMLError_NoPermission(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(4)  # NVML_ERROR_NO_PERMISSION


class NVMLError_FunctionNotFound(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(13)  # `_nvmlGetFunctionPointer`: the driver's library lacks the function


class NVMLError_NotFound(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(6)  # NVML_ERROR_NOT_FOUND: nvmlDeviceGetProcessUtilization has no sample that new


@dataclass
class FakeProcessSample:
    """c_nvmlProcessUtilizationSample_t's fields: `('pid', c_uint), ('timeStamp', c_ulonglong), ('smUtil', c_uint),
    ('memUtil', c_uint), ('encUtil', c_uint), ('decUtil', c_uint)`."""

    pid: int
    timeStamp: int  # noqa: N815 (NVML's name)
    smUtil: int  # noqa: N815
    memUtil: int = 0  # noqa: N815


@dataclass
class FakeUtilization:
    gpu: int  # c_nvmlUtilization_t's fields: percent of time a kernel ran, memory controller busy
    memory: int


class NVMLLibraryMismatchError(Exception):
    """pynvml 13 raises this (a plain Exception, not an NVMLError) from the unversioned
    nvmlDeviceGetComputeRunningProcesses when the driver lacks `_v3` (its `throwOnVersionMismatch`)."""


class FakeNvml:
    """Stands in for the pynvml module: physical index -> used bytes and running processes.

    Tests change `used` and `procs` between reads, as the GPUs would change under a real run.
    `uuids` maps UUID/MIG names to indices (nvmlDeviceGetHandleByUUID); `old_driver` makes the
    unversioned process query fail as pynvml 13 does on a driver without `_v3`; `deny` names the calls
    that raise NVMLError_NoPermission ("Insufficient Permissions"), as MIG without privileges does.
    `activity[index]` holds what the activity queries return, in NVML's units (utilisation %, SM clock MHz,
    power mW, energy mJ since the driver loaded); `unsupported[index]` names the queries that raise
    NVMLError_NotSupported on that GPU, `missing` those the driver's library lacks (NVMLError_FunctionNotFound).
    """

    NVMLError = NVMLError
    NVMLError_NotFound = NVMLError_NotFound
    NVMLLibraryMismatchError = NVMLLibraryMismatchError
    NVML_CLOCK_SM = 1  # pynvml.py: `NVML_CLOCK_SM        = 1`
    NVML_SUCCESS = 0  # pynvml.py: `NVML_SUCCESS                       = 0`

    def __init__(self, used: dict[int, int], procs: dict[int, list[tuple[int, int | None]]],
                 uuids: dict[str, int] | None = None, old_driver: bool = False, deny: tuple[str, ...] = (),
                 activity: dict[int, dict[str, int]] | None = None,
                 unsupported: dict[int, tuple[str, ...]] | None = None, missing: tuple[str, ...] = ()) -> None:
        self.used, self.procs = used, procs
        self.uuids, self.old_driver, self.deny = uuids or {}, old_driver, deny
        self.activity = activity or {}
        self.unsupported, self.missing = unsupported or {}, missing
        self.initialised = self.shut_down = 0
        self.host_pids: dict[int, int] = {}  # a container's PID -> the host's, as NVML reports it
        self.process_samples: dict[int, list[FakeProcessSample]] = {}  # per GPU: nvmlDeviceGetProcessUtilization's
        self.handles_asked: list[int | str] = []
        self.asked: list[tuple[str, int]] = []

    def _check(self, call: str) -> None:
        if call in self.deny:
            raise NVMLError_NoPermission()

    def _figure(self, query: str, handle: tuple[str, int]) -> int:
        self.asked.append((query, handle[1]))
        if query in self.missing:
            raise NVMLError_FunctionNotFound()
        if query in self.unsupported.get(handle[1], ()):
            raise NVMLError_NotSupported()
        return self.activity.get(handle[1], {}).get(query, 0)

    def nvmlDeviceGetUtilizationRates(self, handle: tuple[str, int]) -> FakeUtilization:  # noqa: N802
        return FakeUtilization(gpu=self._figure("utilization", handle), memory=0)

    def nvmlDeviceGetClockInfo(self, handle: tuple[str, int], clock_type: int) -> int:  # noqa: N802
        assert clock_type == self.NVML_CLOCK_SM
        return self._figure("sm_clock", handle)

    def nvmlDeviceGetPowerUsage(self, handle: tuple[str, int]) -> int:  # noqa: N802
        return self._figure("power", handle)  # milliwatts

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: tuple[str, int]) -> int:  # noqa: N802
        return self._figure("energy", handle)  # millijoules

    def nvmlInit(self) -> None:  # noqa: N802
        self.initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut_down += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:  # noqa: N802
        self.handles_asked.append(index)
        return ("handle", index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> tuple[str, int]:  # noqa: N802
        self.handles_asked.append(uuid)
        return ("handle", self.uuids[uuid])

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[str, int]) -> FakeMemoryInfo:  # noqa: N802
        self._check("memory")
        return FakeMemoryInfo(self.used[handle[1]])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: tuple[str, int]) -> list[FakeProcess]:  # noqa: N802
        if self.old_driver:
            raise NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match "
                                           "the NVML lib version.")
        return self.nvmlDeviceGetComputeRunningProcesses_v2(handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: tuple[str, int]) -> list[FakeProcess]:  # noqa: N802
        """`host_pids` is the container mode: NVML answers with the PIDs of the host's namespace, which differ
        from those the processes have inside (NVIDIA/nvidia-docker#179: "nvidia-smi is not able to show the
        processes ... because of the PID namespace")."""
        self._check("processes")
        return [FakeProcess(self.host_pids.get(pid, pid), used) for pid, used in self.procs.get(handle[1], [])]

    def nvmlDeviceGetProcessUtilization(self, handle: tuple[str, int], time_stamp: int) -> list[FakeProcessSample]:  # noqa: N802
        """pynvml: `def nvmlDeviceGetProcessUtilization(handle, timeStamp)`: the samples newer than `timeStamp`
        (µs); with none, the driver's NVML_ERROR_NOT_FOUND (`raise NVMLError(ret)` maps it to NVMLError_NotFound)."""
        self._figure("process_utilization", handle)
        newer = [p for p in self.process_samples.get(handle[1], []) if p.timeStamp > time_stamp]
        if not newer:
            raise NVMLError_NotFound()
        return newer

    def nvmlSystemGetDriverVersion(self) -> bytes:  # noqa: N802
        return b"550.54.15"

    def nvmlDeviceGetName(self, handle: tuple[str, int]) -> str | bytes:  # noqa: N802
        return b"NVIDIA H100" if handle[1] == 0 else "NVIDIA A100"

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 (pynvml.py: `return c_count.value`, every GPU on the machine)
        return len(self.used)


LAUNCHER, OTHER_USER, RANK0, RANK1, STRANGER = 1000, 999, 1001, 1002, 1003


def mib(n: float) -> int:
    return int(n * MIB)


def nvml_run() -> tuple[MemoryTracker, FakeNvml, NvmlSource]:
    """Baseline, then two reads of a 2-rank run on physical GPUs 0 and 3."""
    fake = FakeNvml(used={0: mib(300), 3: mib(0)},
                    procs={0: [(OTHER_USER, mib(250)), (LAUNCHER, mib(50))]})
    source = NvmlSource([0, 3], nvml=fake)
    tracker = MemoryTracker()
    tracker.add(source.read())  # baseline

    fake.used = {0: mib(1300), 3: mib(700)}
    fake.procs = {0: [(OTHER_USER, mib(250)), (LAUNCHER, mib(120)), (RANK0, mib(900))],
                  3: [(RANK1, mib(650)), (STRANGER, None)]}
    tracker.add(source.read())

    fake.used = {0: mib(1100), 3: mib(1500)}
    fake.procs = {0: [(OTHER_USER, mib(250)), (LAUNCHER, mib(80)), (RANK0, mib(700))],
                  3: [(RANK1, mib(1400))]}
    tracker.add(source.read())
    return tracker, fake, source


def test_nvml_source_reads_physical_ids_in_mib():
    fake = FakeNvml(used={0: mib(10), 3: mib(2048)}, procs={3: [(42, mib(512)), (43, None)]})
    source = NvmlSource([0, 3], nvml=fake)
    assert fake.initialised == 1 and fake.handles_asked == [0, 3]
    sample = source.read()
    assert sample.per_device == {"cuda:0": 10.0, "cuda:3": 2048.0}
    assert sample.per_process == {(42, "cuda:3"): 512.0, (43, "cuda:3"): None}  # hidden by the driver: unknown
    assert source.describe() == {"driver": "550.54.15", "gpu_names": ["NVIDIA H100", "NVIDIA A100"]}
    source.close()
    assert fake.shut_down == 1


def test_tracker_first_read_is_the_baseline_and_peaks_are_maxima():
    tracker, _, _ = nvml_run()
    assert tracker.baseline is not None
    assert tracker.baseline.per_device == {"cuda:0": 300.0, "cuda:3": 0.0}
    assert tracker.samples == 2  # the baseline is not a sample
    assert tracker.peak_device == {"cuda:0": 1300.0, "cuda:3": 1500.0}
    assert tracker.peak_process == {
        (OTHER_USER, "cuda:0"): 250.0, (LAUNCHER, "cuda:0"): 120.0, (RANK0, "cuda:0"): 900.0,
        (RANK1, "cuda:3"): 1400.0, (STRANGER, "cuda:3"): None,
    }


def test_tracker_baseline_does_not_count_as_a_peak():
    tracker = MemoryTracker()
    tracker.add(Sample(per_device={"cuda:0": 5000.0}, per_process={(1, "cuda:0"): 5000.0}))
    tracker.add(Sample(per_device={"cuda:0": 100.0}, per_process={(1, "cuda:0"): 100.0}))
    assert tracker.peak_device == {"cuda:0": 100.0}
    assert tracker.peak_process == {(1, "cuda:0"): 100.0}


def test_summarize_nvml_drops_other_users_and_labels_ranks_and_launcher():
    tracker, _, _ = nvml_run()
    ranks = [RankProcess(0, RANK0, "cuda:0", "node1"), RankProcess(1, RANK1, "cuda:3", "node1")]
    memory = summarize(tracker, "nvml", ["cuda:0", "cuda:3"], ranks, launcher_pid=LAUNCHER)
    assert memory["source"] == "nvml" and memory["samples"] == 2
    assert memory["per_device"] == [
        {"device": "cuda:0", "peak_mib": 1300.0, "baseline_mib": 300.0},
        {"device": "cuda:3", "peak_mib": 1500.0, "baseline_mib": 0.0},
    ]
    by_pid = {p["pid"]: p for p in memory["per_process"]}
    assert OTHER_USER not in by_pid  # on the GPU before the run: someone else's
    assert set(by_pid) == {LAUNCHER, RANK0, RANK1, STRANGER}
    assert by_pid[RANK0] == {"pid": RANK0, "rank": 0, "device": "cuda:0", "peak_mib": 900.0, "role": "rank",
                             "host": "node1"}
    assert (by_pid[RANK1]["rank"], by_pid[RANK1]["device"], by_pid[RANK1]["peak_mib"]) == (1, "cuda:3", 1400.0)
    assert by_pid[LAUNCHER]["role"] == "launcher" and by_pid[LAUNCHER]["rank"] is None
    assert by_pid[LAUNCHER]["peak_mib"] == 120.0  # kept although it was there at baseline
    assert by_pid[STRANGER]["role"] == "other" and by_pid[STRANGER]["peak_mib"] is None  # unknown, not 0


def test_summarize_nvml_one_process_strategy_launcher_is_the_rank():
    tracker, _, _ = nvml_run()
    memory = summarize(tracker, "nvml", ["cuda:0"], [RankProcess(0, LAUNCHER, "cuda:0")], launcher_pid=LAUNCHER)
    by_pid = {p["pid"]: p for p in memory["per_process"]}
    assert by_pid[LAUNCHER]["role"] == "rank" and by_pid[LAUNCHER]["rank"] == 0
    assert [d["device"] for d in memory["per_device"]] == ["cuda:0"]


def test_inside_a_container_nvmls_host_pids_are_matched_to_their_ranks_by_device():
    """NVML reports host PIDs (RANK0 as 51001, RANK1 as 51002): each is the only new PID on its rank's device,
    so the memory is the rank's, with NVML's PID beside it; the PID that cannot be matched is not called a
    stranger (RANK1's device has two new host PIDs in the second run)."""
    fake = FakeNvml(used={0: mib(100), 3: mib(0)}, procs={0: [(OTHER_USER, mib(100))]})
    fake.host_pids = {OTHER_USER: 50999, RANK0: 51001, RANK1: 51002, STRANGER: 51003}
    source = NvmlSource([0, 3], nvml=fake)
    tracker = MemoryTracker()
    tracker.add(source.read())
    fake.used = {0: mib(1100), 3: mib(900)}
    fake.procs = {0: [(OTHER_USER, mib(100)), (RANK0, mib(1000))], 3: [(RANK1, mib(900))]}
    tracker.add(source.read())
    ranks = [RankProcess(0, RANK0, "cuda:0"), RankProcess(1, RANK1, "cuda:3")]
    memory = summarize(tracker, "nvml", ["cuda:0", "cuda:3"], ranks, launcher_pid=LAUNCHER)
    rows = sorted((p["pid"], p["rank"], p["device"], p["peak_mib"], p["role"], p.get("nvml_pid"))
                  for p in memory["per_process"])
    assert rows == [(RANK0, 0, "cuda:0", 1000.0, "rank", 51001), (RANK1, 1, "cuda:3", 900.0, "rank", 51002)]

    fake.procs = {0: [(OTHER_USER, mib(100)), (RANK0, mib(1000))], 3: [(RANK1, mib(900)), (STRANGER, mib(5))]}
    tracker.add(source.read())
    memory = summarize(tracker, "nvml", ["cuda:0", "cuda:3"], ranks, launcher_pid=LAUNCHER)
    roles = {p["pid"]: (p["rank"], p["role"]) for p in memory["per_process"]}
    assert roles == {RANK0: (0, "rank"), 51002: (None, "unmatched"), 51003: (None, "unmatched")}
    processes = [ProcessMemory(**p) for p in memory["per_process"]]
    _, flags = _pid_layout(SimpleNamespace(ranks=[], world_size=2), processes)  # type: ignore[arg-type]
    assert flags == [f"PID {pid} on cuda:3 is not a PID this run knows and could not be matched to a rank (NVML "
                     "inside a container reports the host's PIDs): its memory is not attributed"
                     for pid in (51002, 51003)]


def test_inside_a_container_one_process_on_every_gpu_is_matched_on_each():
    """DataParallel: one process, the rank on cuda:0, holding memory on both GPUs under one host PID."""
    fake = FakeNvml(used={0: 0, 1: 0}, procs={})
    fake.host_pids = {LAUNCHER: 61000}
    source = NvmlSource([0, 1], nvml=fake)
    tracker = MemoryTracker()
    tracker.add(source.read())
    fake.procs = {0: [(LAUNCHER, mib(3000))], 1: [(LAUNCHER, mib(2000))]}
    tracker.add(source.read())
    memory = summarize(tracker, "nvml", ["cuda:0", "cuda:1"], [RankProcess(0, LAUNCHER, "cuda:0")],
                       launcher_pid=LAUNCHER)
    assert sorted((p["pid"], p["device"], p["role"], p["peak_mib"]) for p in memory["per_process"]) == [
        (LAUNCHER, "cuda:0", "rank", 3000.0), (LAUNCHER, "cuda:1", "rank", 2000.0)]


def test_summarize_without_any_read():
    memory = summarize(MemoryTracker(), "nvml", ["cuda:0"], [], launcher_pid=1)
    assert memory["per_device"] == [{"device": "cuda:0", "peak_mib": 0.0, "baseline_mib": 0.0}]
    assert memory["per_process"] == [] and memory["samples"] == 0


class FlakySource:
    """Reads 100, 300, 200 MiB..., then raises from read number `fail_at` on."""

    name = "flaky"

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.reads, self.closed = fail_at, 0, False
        self.failed = threading.Event()

    def read(self) -> Sample:
        self.reads += 1
        if self.reads >= self.fail_at:
            self.failed.set()
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        mib_used = [100.0, 300.0, 200.0, 250.0][(self.reads - 1) % 4]
        return Sample(per_device={"cuda:0": mib_used}, per_process={(7, "cuda:0"): mib_used / 2})

    def close(self) -> None:
        self.closed = True


def test_sampler_failure_sets_a_warning_and_keeps_the_peaks():
    source = FlakySource(fail_at=4)  # baseline 100, samples 300 and 200, then the driver fails
    sampler = MemorySampler(source, interval_s=0.001).start()
    assert source.failed.wait(30), "the sampler thread never reached the failing read"
    tracker = sampler.stop()
    assert source.reads == 4  # no read after the failure, not even the final one in stop()
    assert source.closed
    assert sampler.warning is not None
    assert "flaky" in sampler.warning and "NVML_ERROR_GPU_IS_LOST" in sampler.warning
    assert tracker.baseline.per_device == {"cuda:0": 100.0}
    assert tracker.samples == 2
    assert tracker.peak_device == {"cuda:0": 300.0}
    assert tracker.peak_process == {(7, "cuda:0"): 150.0}


def test_sampler_failing_at_baseline_leaves_an_empty_tracker():
    source = FlakySource(fail_at=1)
    sampler = MemorySampler(source, interval_s=0.001).start()
    tracker = sampler.stop()
    assert sampler.warning is not None and source.reads == 1
    assert tracker.baseline is None and tracker.peak_device == {}


def test_sampler_stop_takes_a_final_read():
    source = FlakySource(fail_at=10_000)
    sampler = MemorySampler(source, interval_s=3600).start()  # the thread waits: only start and stop read
    tracker = sampler.stop()
    assert source.reads == 2 and sampler.warning is None
    assert tracker.samples == 1 and tracker.peak_device == {"cuda:0": 300.0}


def test_open_source_picks_psutil_on_cpu_and_reports_missing_nvml():
    source, warning = open_source("cpu", (), os.getpid())
    assert isinstance(source, PsutilSource) and warning is None

    def broken(ids, tokens=(), host=None):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    source, warning = open_source("cuda", (0,), os.getpid(), nvml_factory=broken)
    assert source is None and "NVML unavailable" in warning and "libnvidia-ml" in warning


ALLOC_MIB = 50
CHILD = (f"import sys, time\nblock = b'x' * ({ALLOC_MIB} * 2**20)\nprint('ready', flush=True)\n"
         "sys.stdin.read()\n")


@pytest.fixture
def two_children():
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        yield procs
    finally:
        for proc in procs:
            proc.stdin.close()  # EOF: the child exits
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.slow
def test_psutil_source_sees_real_worker_processes(two_children):
    launcher = os.getpid()
    source = PsutilSource(launcher)
    sample = source.read()
    pids = [p.pid for p in two_children]
    for pid in pids:
        assert sample.per_process[(pid, "cpu")] > ALLOC_MIB
    assert (launcher, "cpu") in sample.per_process
    assert sample.per_device == {}


@pytest.mark.slow
def test_psutil_summary_maps_worker_pids_to_ranks_and_devices(two_children):
    launcher = os.getpid()
    source = PsutilSource(launcher)
    tracker = MemoryTracker()
    tracker.add(Sample(per_process={(launcher, "cpu"): 1.0}))  # baseline: before the workers existed
    tracker.add(source.read())
    tracker.add(source.read())
    pids = [p.pid for p in two_children]
    ranks = [RankProcess(0, pids[0], "cpu:0"), RankProcess(1, pids[1], "cpu:1")]
    memory = summarize(tracker, "psutil", ["cpu:0", "cpu:1"], ranks, launcher_pid=launcher)

    assert memory["source"] == "psutil"
    rows = memory["per_process"]
    assert [(p["pid"], p["rank"], p["device"], p["role"]) for p in rows] == \
        [(pids[0], 0, "cpu:0", "rank"), (pids[1], 1, "cpu:1", "rank")]  # the launcher is not a worker
    assert all(p["peak_mib"] > ALLOC_MIB for p in rows)
    devices = {d["device"]: d for d in memory["per_device"]}
    assert list(devices) == ["cpu:0", "cpu:1"]
    for row in rows:
        assert devices[row["device"]]["peak_mib"] == row["peak_mib"]
        assert devices[row["device"]]["baseline_mib"] == 0.0


def test_psutil_summary_one_process_strategy_counts_the_launcher():
    launcher = os.getpid()
    source = PsutilSource(launcher)
    tracker = MemoryTracker()
    tracker.add(source.read())
    tracker.add(source.read())
    memory = summarize(tracker, "psutil", ["cpu"], [RankProcess(0, launcher, "cpu")], launcher_pid=launcher)
    assert [(p["pid"], p["rank"], p["device"]) for p in memory["per_process"]] == [(launcher, 0, "cpu")]
    (device,) = memory["per_device"]
    assert device["device"] == "cpu" and device["peak_mib"] > 0
    assert device["baseline_mib"] == round(tracker.baseline.per_process[(launcher, "cpu")], 1)


# --- NVML as real drivers misbehave (GPU-truth fixes: UUID tokens, old drivers, MIG permissions) ----------

def test_gpus_named_by_uuid_are_opened_by_uuid():
    """Before: CUDA_VISIBLE_DEVICES=GPU-...,MIG-... fell back to indices 0,1 and read the wrong GPUs."""
    fake = FakeNvml(used={5: mib(100), 2: mib(200)}, procs={}, uuids={"GPU-aaaa": 5, "MIG-bbbb": 2})
    source = NvmlSource([5, 2], nvml=fake, tokens=["GPU-aaaa", "MIG-bbbb"])
    assert fake.handles_asked == ["GPU-aaaa", "MIG-bbbb"]
    assert source.read().per_device == {"cuda:5": 100.0, "cuda:2": 200.0}


def test_old_driver_falls_back_to_the_v2_process_query():
    fake = FakeNvml(used={0: mib(100)}, procs={0: [(42, mib(64))]}, old_driver=True)
    source = NvmlSource([0], nvml=fake)
    assert source.read().per_process == {(42, "cuda:0"): 64.0}
    assert source.read().per_process == {(42, "cuda:0"): 64.0} and source.process_warning is None


def test_denied_process_query_keeps_the_gpu_figures_and_says_why():
    fake = FakeNvml(used={0: mib(100)}, procs={0: [(42, mib(64))]}, deny=("processes",))
    source = NvmlSource([0], nvml=fake)
    sampler = MemorySampler(source, interval_s=3600).start()
    fake.used = {0: mib(900)}
    sampler.stop()
    assert sampler.tracker.peak_device == {"cuda:0": 900.0} and sampler.tracker.peak_process == {}
    assert sampler.warning and "per-process" in sampler.warning and "Insufficient Permissions" in sampler.warning


def test_sampler_whose_every_read_fails_takes_no_sample():
    fake = FakeNvml(used={0: mib(100)}, procs={}, deny=("memory",))
    sampler = MemorySampler(NvmlSource([0], nvml=fake), interval_s=3600).start()
    sampler.stop()
    assert sampler.tracker.samples == 0 and "Insufficient Permissions" in sampler.warning


@pytest.mark.slow
def test_psutil_source_lists_new_workers_every_fifth_of_a_second():
    """Workers start after the sampler: a read within 0.2 s of the last listing reads the known processes
    only; the next listing finds the new ones (a sampler that never re-lists would miss every worker)."""
    now = [100.0]
    source = PsutilSource(os.getpid(), clock=lambda: now[0])
    assert os.getpid() in {pid for pid, _ in source.read().per_process}
    child = subprocess.Popen(["sleep", "30"])
    try:
        now[0] += 0.1
        assert child.pid not in {pid for pid, _ in source.read().per_process}
        now[0] += 0.15
        assert child.pid in {pid for pid, _ in source.read().per_process}
    finally:
        child.kill()
        child.wait()
    now[0] += 1.0
    assert child.pid not in {pid for pid, _ in source.read().per_process}  # ended: no longer read


def test_cpu_baseline_is_the_ranks_own_start_whether_inline_or_launched():
    """An inline rank (the launcher, 700 MiB at the sampler's first read) and a launched one (not yet born at
    that read) both count from their own resident memory when the rank started."""
    tracker = MemoryTracker()
    tracker.add(Sample(per_process={(1, "cpu"): 700.0}))  # baseline: only the launcher exists
    tracker.add(Sample(per_process={(1, "cpu"): 950.0, (2, "cpu"): 800.0}))
    ranks = [RankProcess(0, 1, "cpu:0", rss_at_start_mib=720.0), RankProcess(1, 2, "cpu:1", rss_at_start_mib=500.0)]
    memory = summarize(tracker, "psutil", ["cpu:0", "cpu:1"], ranks, launcher_pid=1)
    assert memory["per_device"] == [{"device": "cpu:0", "peak_mib": 950.0, "baseline_mib": 720.0},
                                    {"device": "cpu:1", "peak_mib": 800.0, "baseline_mib": 500.0}]


# --- DataLoader workers: the PIDs a rank's workers noted, counted as `role: data` ----------------------------

DATA0, DATA1 = 2001, 2002


def test_psutil_counts_a_ranks_dataloader_workers_on_its_device():
    tracker = MemoryTracker()
    tracker.add(Sample(per_process={(LAUNCHER, "cpu"): 500.0}))  # baseline: no worker yet
    # STRANGER is another process below the ranks (a compiler's worker, say): not the rank's data, not counted
    tracker.add(Sample(per_process={(LAUNCHER, "cpu"): 510.0, (RANK0, "cpu"): 900.0, (RANK1, "cpu"): 880.0,
                                    (DATA0, "cpu"): 150.0, (DATA1, "cpu"): 140.0, (STRANGER, "cpu"): 77.0}))
    ranks = [RankProcess(0, RANK0, "cpu:0", "h", rss_at_start_mib=400.0, data_pids=(DATA0, DATA1)),
             RankProcess(1, RANK1, "cpu:1", "h", rss_at_start_mib=410.0)]
    memory = summarize(tracker, "psutil", ["cpu:0", "cpu:1"], ranks, launcher_pid=LAUNCHER)
    rows = {p["pid"]: p for p in memory["per_process"]}
    assert set(rows) == {RANK0, RANK1, DATA0, DATA1}
    assert rows[DATA0] == {"pid": DATA0, "rank": 0, "device": "cpu:0", "peak_mib": 150.0, "role": "data", "host": "h"}
    assert (rows[DATA1]["role"], rows[DATA1]["rank"]) == ("data", 0)
    # cpu:0 is rank 0 and its two workers: 900 + 150 + 140; its baseline the rank's own start
    assert memory["per_device"] == [{"device": "cpu:0", "peak_mib": 1190.0, "baseline_mib": 400.0},
                                    {"device": "cpu:1", "peak_mib": 880.0, "baseline_mib": 410.0}]
    from harness.core.results import from_dict
    from harness.memory import imbalance

    balance = imbalance.analyze(from_dict({"schema": 2, "status": "ok", "strategy": "ddp", "amp": "O0", "model": "m",
                                           "memory": memory, "world_size": 2}))
    assert [d["pids"] for d in balance.devices] == [[RANK0], [RANK1]]  # devices list the processes driving them


def test_nvml_runs_read_the_data_workers_host_memory_beside_the_gpus():
    fake = FakeNvml(used={0: mib(100)}, procs={})
    host = FakeHost()
    source = NvmlSource([0], nvml=fake, host=host, clock=lambda: 5.0)
    tracker = MemoryTracker()
    tracker.add(source.read())
    fake.procs = {0: [(RANK0, mib(900))]}
    host.rss = {LAUNCHER: 300.0, RANK0: 700.0, DATA0: 120.0, STRANGER: 50.0}
    tracker.add(source.read())
    ranks = [RankProcess(0, RANK0, "cuda:0", "h", data_pids=(DATA0,))]
    memory = summarize(tracker, "nvml", ["cuda:0"], ranks, launcher_pid=LAUNCHER)
    rows = {p["pid"]: p for p in memory["per_process"]}
    assert set(rows) == {RANK0, DATA0}  # host memory of the others is not GPU memory: not listed
    assert rows[RANK0]["peak_mib"] == 900.0 and rows[RANK0]["role"] == "rank"
    assert rows[DATA0] == {"pid": DATA0, "rank": 0, "device": "cuda:0", "peak_mib": 120.0, "role": "data", "host": "h"}
    assert memory["per_device"] == [{"device": "cuda:0", "peak_mib": 100.0, "baseline_mib": 100.0}]


class FakeHost:
    """PsutilSource's reads: the launcher's process tree, resident MiB by pid."""

    name = "psutil"

    def __init__(self) -> None:
        self.rss: dict[int, float] = {LAUNCHER: 300.0}

    def read(self) -> Sample:
        return Sample(per_process={(pid, "cpu"): mib for pid, mib in self.rss.items()})

    def pids(self) -> set[int]:
        return set(self.rss)

    def close(self) -> None:
        pass


# --- GPU activity and energy through NVML -------------------------------------------------------------------

def test_nvml_activity_in_plain_units_and_unsupported_figures_are_none_never_asked_again():
    fake = FakeNvml(used={0: mib(1), 1: mib(1)}, procs={},
                    activity={0: {"utilization": 87, "sm_clock": 1980, "power": 312_500, "energy": 4_000_000},
                              1: {"utilization": 40, "sm_clock": 1410, "power": 90_000}},
                    unsupported={1: ("energy",)})
    source = NvmlSource([0, 1], nvml=fake, clock=lambda: 7.0)
    first = source.read()
    assert first.at == 7.0
    assert first.activity["cuda:0"] == {"utilization_pct": 87.0, "sm_clock_mhz": 1980.0, "power_w": 312.5,
                                        "energy_j": 4000.0, "others_sm_pct": None}  # no host tree: PIDs unknown
    assert first.activity["cuda:1"]["energy_j"] is None  # NVMLError_NotSupported: unavailable, not 0
    assert first.activity["cuda:1"]["power_w"] == 90.0
    assert source.unsupported == {"cuda:1 energy_j": "Not Supported"}
    source.read()
    assert fake.asked.count(("energy", 1)) == 1  # refused once, never asked again
    assert fake.asked.count(("energy", 0)) == 2


def test_an_old_driver_without_the_energy_call_is_unavailable_too():
    fake = FakeNvml(used={0: mib(1)}, procs={}, activity={0: {"utilization": 5}}, missing=("energy", "power"))
    sampler = MemorySampler(NvmlSource([0], nvml=fake), interval_s=3600).start()
    sampler.stop()
    assert sampler.warning is None  # memory figures go on
    assert sampler.unsupported == {"cuda:0 power_w": "Function Not Found", "cuda:0 energy_j": "Function Not Found"}
    assert [per["cuda:0"]["utilization_pct"] for _, per in sampler.tracker.activity] == [5.0, 5.0]


def test_energy_per_image_over_the_steady_windows_by_hand():
    from harness.launch.activity import activity_section, counter_at

    # readings every second; GPU 0's counter rises 100 J/s, GPU 1's 50 J/s; utilisation 10 % then 90 %
    readings = [(float(t), {"cuda:0": {"utilization_pct": 10.0 if t < 3 else 90.0, "sm_clock_mhz": 1500.0,
                                       "power_w": 100.0, "energy_j": 1000.0 + 100 * t},
                            "cuda:1": {"utilization_pct": 50.0, "sm_clock_mhz": None, "power_w": 50.0,
                                       "energy_j": 50.0 * t}}) for t in range(0, 8)]
    assert counter_at([(0.0, 0.0), (1.0, 10.0)], 0.25) == 2.5 and counter_at([(0.0, 0.0)], 3.0) is None
    # steady windows 3.5-5.0 and 5.0-6.5 (3 s in all) trained 2 x 200 images
    activity, per_image = activity_section(readings, [(3.5, 5.0), (5.0, 6.5)], 400, {})
    gpu0, gpu1 = activity["per_device"]
    assert gpu0["energy_j"] == pytest.approx(300.0) and gpu1["energy_j"] == pytest.approx(150.0)
    assert per_image == pytest.approx(450.0 / 400)
    assert gpu0["utilization_pct"] == 90.0  # readings at 4, 5 and 6 s only: the warm-up's 10 % left out
    assert gpu1["sm_clock_mhz"] is None and activity["readings"] == 3


def test_energy_is_read_over_the_steady_windows_only():
    """Three windows of rank 0: the warm-up (0-2 s), a steady one (2-3 s), a profiled one (3-5 s): only 2-3 s is
    steady. With the counter rising 100 J/s and 64 images a window, that is 100 J / 64 images, not 500 / 192."""
    from harness.core.timing import Window
    from harness.launch.activity import activity_section, steady_spans

    windows = [Window(20, 2.0, 2.0, warmup=True), Window(40, 1.0, 3.0, warmup=False),
               Window(60, 2.0, 5.0, warmup=False, profiled=True)]
    spans = steady_spans(windows, [[0.0, 2.0], [2.0, 3.0], [3.0, 5.0]])
    assert spans == [(2.0, 3.0)]
    readings = [(t / 2, {"cuda:0": {"utilization_pct": 50.0, "sm_clock_mhz": 1500.0, "power_w": 100.0,
                                    "energy_j": 50.0 * t}}) for t in range(11)]
    _, per_image = activity_section(readings, spans, 64 * len(spans), {})
    assert per_image == pytest.approx(100.0 / 64)


def test_energy_per_image_is_none_when_a_gpu_has_no_counter():
    from harness.launch.activity import activity_section

    readings = [(float(t), {"cuda:0": {"utilization_pct": 1.0, "sm_clock_mhz": 1.0, "power_w": 1.0, "energy_j": 10.0 * t},
                            "cuda:1": {"utilization_pct": 1.0, "sm_clock_mhz": 1.0, "power_w": 1.0, "energy_j": None}})
                for t in range(5)]
    activity, per_image = activity_section(readings, [(1.0, 3.0)], 100, {"cuda:1 energy_j": "Not Supported"})
    assert per_image is None  # one GPU's energy unknown: the run's is unknown, never a partial sum
    assert activity["per_device"][1]["energy_j"] is None and activity["per_device"][0]["energy_j"] == 20.0
    assert activity["unavailable"] == {"cuda:1 energy_j": "Not Supported"}


def test_other_pids_sm_utilisation_on_the_runs_gpus_leaves_out_the_runs_own_processes():
    """nvmlDeviceGetProcessUtilization lists every PID on the GPU: the run's (the host tree's) are not others;
    each reading asks only for samples newer than the last one seen; no new sample: nobody else ran (0)."""
    fake = FakeNvml(used={0: mib(1)}, procs={})
    host = FakeHost()
    host.rss = {LAUNCHER: 300.0, RANK0: 900.0}
    fake.process_samples = {0: [FakeProcessSample(RANK0, 100, smUtil=95), FakeProcessSample(STRANGER, 120, smUtil=30),
                                FakeProcessSample(OTHER_USER, 130, smUtil=12)]}
    source = NvmlSource([0], nvml=fake, host=host)  # type: ignore[arg-type]
    assert source.read().activity["cuda:0"]["others_sm_pct"] == 30.0  # not the rank's 95
    assert source.read().activity["cuda:0"]["others_sm_pct"] == 0.0  # nothing newer than 130 µs
    fake.process_samples[0].append(FakeProcessSample(STRANGER, 200, smUtil=7))
    assert source.read().activity["cuda:0"]["others_sm_pct"] == 7.0
    fake.unsupported = {0: ("process_utilization",)}
    fake.process_samples[0].append(FakeProcessSample(STRANGER, 300, smUtil=50))
    assert source.read().activity["cuda:0"]["others_sm_pct"] is None  # NotSupported: unknown, never 0
    assert source.unsupported["cuda:0 others_sm_pct"] == "Not Supported"
