"""The benchmark's typed config: the `collectives.*` keys checked as every other section is (harness.core.options'
record check for unknown keys and types, then ranges), one line naming the key on failure; and where its
workers go, placed by the same checks config.yaml's `gpus`/`nprocs`/`dist` get."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.collectives.arithmetic import DTYPES, OPS, parse_size, size_ladder
from harness.core.config import check_dist, check_gpus, check_nprocs
from harness.core.devices import Placement
from harness.core.errors import ConfigError
from harness.core.options import check_record
from harness.launch.placement import Hardware, place_workers

Size = int | str  # 4096, "4KiB", "64MiB", "1GiB"
SIZE_HINT = "a size such as 4096, 4KiB, 64MiB or 1GiB"


@dataclass(frozen=True)
class FaultSection:
    """`collectives.fault.*` as typed (debugging aid: rank `rank` runs out of memory at `size`)."""

    rank: int | None = None
    size: Size | None = None


@dataclass(frozen=True)
class CollectivesSection:
    """`collectives.*` as typed; the defaults stand here once. `sizes` wins over the min/max/factor ladder."""

    ops: list[str] | str | None = None
    sizes: list[Size] | Size | None = None
    min_size: Size = "4KiB"
    max_size: Size = "64MiB"
    factor: int = 2
    dtype: str = "float32"  # one of DTYPES
    warmup: int = 2
    repeats: int = 5
    fault: Mapping[str, Any] | None = field(default=None)


@dataclass(frozen=True)
class CollectivesConfig:
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str
    warmup: int
    repeats: int
    fault_rank: int | None = None  # debugging aid: this rank runs out of memory at `fault_size`
    fault_size: int | None = None

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> CollectivesConfig:
        """Every check on the `collectives.*` keys, one line naming the key on failure."""
        raw = CollectivesSection(**check_record("collectives", section, CollectivesSection))
        ops = [raw.ops] if isinstance(raw.ops, str) else list(raw.ops or ())
        if not ops or any(op not in OPS for op in ops):
            raise ConfigError("collectives.ops", ops, "a list of " + ", ".join(OPS))
        if raw.sizes:
            listed = raw.sizes if isinstance(raw.sizes, list | tuple) else [raw.sizes]
            sizes = [_size("collectives.sizes", s) for s in listed]
        else:
            low, high = _size("collectives.min_size", raw.min_size), _size("collectives.max_size", raw.max_size)
            if raw.factor < 2:
                raise ConfigError("collectives.factor", raw.factor, "an integer >= 2")
            if high < low:
                raise ConfigError("collectives.max_size", raw.max_size, "at least min_size")
            sizes = size_ladder(low, high, raw.factor)
        if raw.dtype not in DTYPES:
            raise ConfigError("collectives.dtype", raw.dtype, "one of " + ", ".join(DTYPES))
        if raw.warmup < 0:
            raise ConfigError("collectives.warmup", raw.warmup, "an integer >= 0")
        if raw.repeats < 1:
            raise ConfigError("collectives.repeats", raw.repeats, "an integer >= 1")
        fault = FaultSection(**check_record("collectives.fault", raw.fault or {}, FaultSection))
        if fault.rank is not None and fault.rank < 0:
            raise ConfigError("collectives.fault.rank", fault.rank, "null or a rank >= 0")
        fault_size = None if fault.size is None else _size("collectives.fault.size", fault.size)
        return cls(ops=tuple(ops), sizes=tuple(sorted(set(sizes))), dtype=raw.dtype, warmup=raw.warmup,
                   repeats=raw.repeats, fault_rank=fault.rank, fault_size=fault_size)


def _size(key: str, value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError as error:
        raise ConfigError(key, value, SIZE_HINT) from error


def placement_for(cfg: Mapping[str, Any], hw: Hardware) -> Placement:
    """Placed as a DDP run is (one worker per device; gloo on CPU, NCCL on GPUs), with no training batch:
    `gpus`/`nprocs`/`dist` get the very checks config.yaml's keys get."""
    gpus = check_gpus(cfg.get("gpus"))
    nprocs = check_nprocs(cfg.get("nprocs", 2))
    check_dist(cfg.get("dist") or {})
    return place_workers("collectives", gpus, nprocs, hw)
