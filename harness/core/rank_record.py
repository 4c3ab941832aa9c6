"""What one rank measured and how it ended: written once by the rank (`<run>/ranks/rank<N>.json`, so it survives
a failing neighbour) and merged by the parent into results.json without a key look-up.

A figure the run reports once is declared here with `merged(how)`: the field, and how the ranks' values become
the run's (rank 0's, the first rank's that has one, the largest, the sum). The parent merges every such field into
RunRecord's field of the same name (`merge_figures`), so a figure added here and to RunRecord needs no line in
the parent. A figure results.json keeps per rank is a field of the same name in RankEntry (`summary`). The parts a
feature merges itself (`parity`, `profile`) stay that feature's mappings: only the feature writes and reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.core.devices import AllocatorPeak
from harness.core.results import RankEntry, Status, run_fields
from harness.core.timing import Window

Merge = Literal["rank0", "first", "max", "sum"]
MERGE = "merge"  # the metadata key of a `merged` field
# how the values of the ranks that have one become the run's (rank order; None where no rank has one)
MERGES: dict[str, Callable[[list[Any]], Any]] = {"first": lambda values: values[0], "max": max, "sum": sum}


def merged(how: Merge) -> Any:
    """A figure the run reports once, in RunRecord's field of the same name: `how` the ranks' values merge."""
    return field(default=None, metadata={MERGE: how})


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
    status: Status = "failed"  # until the loop ends: a rank that dies mid-way is on record as failed
    error: str | None = None
    backend: str | None = None
    rss_at_start_mib: float | None = None
    windows: list[Window] = field(default_factory=list)
    window_spans: list[tuple[float, float]] = field(default_factory=list)  # each window's (start, end), Unix time
    first_iter_time: float | None = None
    ended_at: float | None = None
    times: RankTimes = field(default_factory=RankTimes)
    stopped_by: str | None = merged("first")  # iterations=auto: why the ranks stopped (together)
    allocator: list[AllocatorPeak] = field(default_factory=list)
    tensor_peak_mib: float | None = None  # CPU: the live-tensor peak over the first iterations
    params_held_mib: float | None = None  # the bytes this rank's parameters hold, as set up (a shard under FSDP2)
    amp_state: dict[str, Any] = field(default_factory=dict)  # the amp plugin's: final loss scale, skipped steps
    compile_seconds: float | None = merged("max")  # compile=true: the compile pass, timed apart (the slowest's)
    window_compile_seconds: float | None = None  # XLA: graphs compiled inside the windows
    data_pids: list[int] = field(default_factory=list)  # DataLoader workers (their memory is the rank's)
    memory_theory: dict[str, Any] | None = merged("rank0")  # harness.memory.footprint's (MemoryTheory)
    parity: dict[str, Any] | None = None  # harness.parity.rank's
    profile: dict[str, Any] | None = None  # harness.profile's
    kernels: dict[str, Any] | None = merged("rank0")  # what torch had while it trained (KernelsConfig, read back)

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

    def summary(self) -> RankEntry:
        """results.json's `ranks` entry: every RankEntry field, from this record's field of the same name."""
        return RankEntry(**{f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(RankEntry)})


def _plain(value: Any) -> Any:
    """A record's value as results.json holds it: records (an allocator peak) as their mappings."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


def merge_figures(records: Sequence[RankRecord]) -> dict[str, Any]:
    """RunRecord's fields from every field declared `merged`, each merged over the ranks as declared (unset: None,
    or an empty mapping) and read into its RunRecord type (a mapping into its record)."""
    zero = next((r for r in records if r.rank == 0), None)
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(RankRecord):
        how = spec.metadata.get(MERGE)
        if how is None:
            continue
        if how == "rank0":
            value = getattr(zero, spec.name) if zero is not None else None
            values[spec.name] = None if value in (None, {}, []) else value
        else:
            found = [v for r in sorted(records, key=lambda r: r.rank) if (v := getattr(r, spec.name)) is not None]
            values[spec.name] = MERGES[how](found) if found else None
    return run_fields(values)
