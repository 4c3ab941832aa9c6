"""What one rank measured and how it ended: written once by the rank (`<run>/ranks/rank<N>.json`, so it survives
a failing neighbour) and merged by the parent into results.json without a key look-up.

A measured figure is added here (the field, with its default) and filled where the rank measures it; the parent
reads the attribute. The parts a feature owns (`parity`, `profile`, `memory_theory`) stay that feature's
mappings: only the feature writes and reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.core.devices import AllocatorPeak
from harness.core.timing import Window


@dataclass
class RankTimes:
    """Unix times a rank stamps as it goes (results.json's `phases` are built from them)."""

    process_started: float | None = None
    entered: float | None = None
    group_ready: float | None = None
    built: float | None = None
    loop_ended: float | None = None


@dataclass
class RankRecord:
    rank: int
    local_rank: int = 0
    pid: int | None = None
    host: str = ""
    device: str = ""
    status: str = "failed"  # until the loop ends: a rank that dies mid-way is on record as failed
    error: str | None = None
    backend: str | None = None
    rss_at_start_mib: float | None = None
    windows: list[Window] = field(default_factory=list)
    window_spans: list[tuple[float, float]] = field(default_factory=list)  # each window's (start, end), Unix time
    first_iter_time: float | None = None
    ended_at: float | None = None
    times: RankTimes = field(default_factory=RankTimes)
    stopped_by: str | None = None  # iterations=auto: why the ranks stopped
    allocator: list[AllocatorPeak] = field(default_factory=list)
    tensor_peak_mib: float | None = None  # CPU: the live-tensor peak over the first iterations
    params_held_mib: float | None = None  # the bytes this rank's parameters hold, as set up (a shard under FSDP2)
    amp_state: dict[str, Any] = field(default_factory=dict)  # the amp plugin's: final loss scale, skipped steps
    compile_seconds: float | None = None  # compile=true: the compile pass, timed apart
    window_compile_seconds: float | None = None  # XLA: graphs compiled inside the windows
    data_pids: list[int] = field(default_factory=list)  # DataLoader workers (their memory is the rank's)
    memory_theory: dict[str, Any] | None = None  # harness.memory.footprint's
    parity: dict[str, Any] | None = None  # harness.parity.rank's
    profile: dict[str, Any] | None = None  # harness.profile's
    kernels: dict[str, Any] | None = None  # what torch had while the rank trained (KernelsConfig, read back)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankRecord:
        """A record as `to_json` wrote it (a key it does not know is an error: the writer and reader are one)."""
        values = dict(data)
        values["windows"] = [Window(**w) for w in values.get("windows") or []]
        values["window_spans"] = [tuple(s) for s in values.get("window_spans") or []]
        values["allocator"] = [AllocatorPeak(**p) for p in values.get("allocator") or []]
        values["times"] = RankTimes(**(values.get("times") or {}))
        return cls(**values)

    def summary(self) -> dict[str, Any]:
        """results.json's `ranks` entry."""
        return {"rank": self.rank, "local_rank": self.local_rank, "pid": self.pid, "host": self.host,
                "device": self.device, "backend": self.backend, "status": self.status, "error": self.error,
                "allocator": [dataclasses.asdict(p) for p in self.allocator], "tensor_peak_mib": self.tensor_peak_mib,
                "params_held_mib": self.params_held_mib}
