"""The benchmark's typed config: conf/collectives.yaml's keys as records, each key written once as its field (its
type, default, range and help; harness.core.defaults' `option`), read as every section of a run is
(harness.core.options' `read_record`), one line naming the key on failure. Hydra composes the defaults from here
(`collectives_defaults`, registered by `register_defaults`), so the yaml holds only Hydra's own settings. Its
workers are placed by the very fields and checks config.yaml's `gpus`/`nprocs`/`dist` get."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from harness.collectives.arithmetic import DTYPES, OPS, format_size, parse_size, size_ladder
from harness.core.config import RUN_FIELDS, DistConfig
from harness.core.defaults import hydra_defaults, on_hardware, option
from harness.core.devices import Placement
from harness.core.errors import ConfigError
from harness.core.options import read_record
from harness.launch.placement import Hardware, place_workers

Size = int | str  # 4096, "4KiB", "64MiB", "1GiB"
SIZE_HINT = "a size such as 4096, 4KiB, 64MiB or 1GiB"
Dtype = Literal[DTYPES]  # the dtypes arithmetic knows, as a Literal: "one of ..." when refused


def _size(key: str, value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError as error:
        raise ConfigError(key, value, SIZE_HINT) from error


def _sizes(key: str, value: Any) -> None:
    if value is None:
        return
    for size in value if isinstance(value, list | tuple) else [value]:
        _size(key, size)


def _ops(key: str, value: list[str] | str) -> None:
    ops = [value] if isinstance(value, str) else list(value)
    if not ops or any(op not in OPS for op in ops):
        raise ConfigError(key, ops, "a list of " + ", ".join(OPS))


@dataclass(frozen=True)
class FaultSection:
    """`collectives.fault.*` (debugging aid: rank `rank` runs out of memory at `size`)."""

    rank: int | None = option(None, "the rank that runs out of memory (`null`: off)", ge=0,
                              allowed="null or a rank >= 0")
    size: Size | None = option(None, "at this message size", check=_sizes)


@dataclass(frozen=True)
class CollectivesSection:
    """`collectives.*`. `sizes` wins over the min/max/factor ladder."""

    ops: list[str] | str = option(list(OPS), "the collectives timed", allowed="a list of " + ", ".join(OPS),
                                  check=_ops)
    sizes: list[Size] | Size | None = option(None, "an explicit list such as [4KiB,1MiB,64MiB]; `null`: min_size to "
                                             "max_size, x factor", check=_sizes)
    min_size: Size = option("4KiB", "the ladder's first size", check=_sizes)
    max_size: Size = on_hardware("256MiB", "64MiB", check=_sizes, help="the ladder's last size")
    factor: int = option(2, "the ladder's step", ge=2)
    dtype: Dtype = option("float32", "the buffers' dtype")
    warmup: int = on_hardware(5, 2, ge=0, help="untimed calls per size")
    repeats: int = on_hardware(20, 10, ge=1, help="timed calls per size, each after a barrier; the median is reported")
    after_compute_ms: list[float] = option([], "also time each size's calls after this long of one rank's matrix "
                                           "products begun at the barrier (a step's compute before its calls), each "
                                           "call's time the mean over the ranks; kept in collectives.json's raw "
                                           "rows (the planner's link: harness.planning)")
    after_compute_at: Size | None = option(None, "the one size timed after compute (null: every size)",
                                           allowed="one of the sizes timed", check=_sizes)
    fault: FaultSection = option(FaultSection)


@dataclass(frozen=True)
class BenchmarkConfig:
    """conf/collectives.yaml's keys: `gpus`, `nprocs` and `dist` are config.yaml's (the same fields: same meaning,
    same checks), `collectives` the benchmark's own."""

    gpus: tuple[int, ...] | None = dataclasses.field(default=RUN_FIELDS["gpus"].default,
                                                     metadata=RUN_FIELDS["gpus"].metadata)
    nprocs: int = dataclasses.field(default=RUN_FIELDS["nprocs"].default, metadata=RUN_FIELDS["nprocs"].metadata)
    dist: DistConfig = option(DistConfig(timeout_s=120), help="collective timeout 120 s: a 256 MiB op over gloo is slow")
    collectives: CollectivesSection = option(CollectivesSection)


def register_defaults() -> None:
    """`collectives_defaults`, the node conf/collectives.yaml composes first: every default above. Untyped: the
    entry point composes inside `@hydra.main`, where a bad `collectives.dtype` would be Hydra's many-line error;
    from_dict refuses it in one line instead."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="collectives_defaults", node=hydra_defaults(BenchmarkConfig, typed=False))


@dataclass(frozen=True)
class CollectivesConfig:
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str
    warmup: int
    repeats: int
    fault_rank: int | None = None  # debugging aid: this rank runs out of memory at `fault_size`
    fault_size: int | None = None
    after_compute_ms: tuple[float, ...] = ()
    after_compute_at: int | None = None  # the size timed after compute; None: every size

    def times_after_compute(self, size: int) -> bool:
        """Whether `size` (as requested) is also timed after compute."""
        return bool(self.after_compute_ms) and self.after_compute_at in (None, size)

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> CollectivesConfig:
        """Every key by its field, then the ladder's relation (max_size at least min_size) and the sizes in bytes."""
        raw = read_record("collectives", section, CollectivesSection)
        ops = [raw.ops] if isinstance(raw.ops, str) else list(raw.ops)
        if raw.sizes:
            listed = raw.sizes if isinstance(raw.sizes, list | tuple) else [raw.sizes]
            sizes = [_size("collectives.sizes", s) for s in listed]
        else:
            low, high = _size("collectives.min_size", raw.min_size), _size("collectives.max_size", raw.max_size)
            if high < low:
                raise ConfigError("collectives.max_size", raw.max_size, "at least min_size")
            sizes = size_ladder(low, high, raw.factor)
        fault_size = None if raw.fault.size is None else _size("collectives.fault.size", raw.fault.size)
        gaps = raw.after_compute_ms if isinstance(raw.after_compute_ms, list | tuple) else [raw.after_compute_ms]
        if any(float(g) <= 0 for g in gaps):
            raise ConfigError("collectives.after_compute_ms", raw.after_compute_ms, "a list of milliseconds above 0")
        after_at = None if raw.after_compute_at is None else _size("collectives.after_compute_at",
                                                                    raw.after_compute_at)
        if after_at is not None and after_at not in sizes:
            raise ConfigError("collectives.after_compute_at", raw.after_compute_at,
                              "one of the sizes timed (" + ", ".join(format_size(s) for s in sorted(set(sizes))) + ")")
        return cls(ops=tuple(ops), sizes=tuple(sorted(set(sizes))), dtype=raw.dtype, warmup=raw.warmup,
                   repeats=raw.repeats, fault_rank=raw.fault.rank, fault_size=fault_size,
                   after_compute_ms=tuple(sorted(float(g) for g in gaps)), after_compute_at=after_at)


def placement_for(cfg: Mapping[str, Any], hw: Hardware) -> Placement:
    """Placed as a DDP run is (one worker per device; gloo on CPU, NCCL on GPUs), with no training batch:
    `gpus`/`nprocs`/`dist` read by config.yaml's own fields."""
    run = read_record("", {k: cfg[k] for k in ("gpus", "nprocs", "dist") if k in cfg}, BenchmarkConfig)
    return place_workers("collectives", run.gpus, run.nprocs, hw)
