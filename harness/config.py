"""Typed records for one run, built from the resolved Hydra config, and every check on user input.

All validation lives here so that bad input is refused in one place, with one line naming the key,
the bad value and what is allowed, before any worker starts.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_GROUPS = ("strategy", "amp", "model", "data", "launcher", "experiment", "combo", "sweep")
AMP_LEVELS = ("O0", "O1", "O2", "O3")
AMP_IMPLS = ("native", "apex")
HALF_DTYPES = ("float16", "bfloat16")
FAULT_KINDS = ("raise", "exit", "oom")
LAUNCHERS = ("elastic", "spawn")
START_METHODS = ("spawn", "fork", "forkserver")
OVERSUBSCRIBE_FACTOR = 4  # nprocs beyond this many per core is refused as a typo, not a benchmark


class ConfigError(ValueError):
    """Bad user input: one line naming the key, the bad value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={_show(value)} is not allowed: {allowed}")


class Incompatible(ConfigError):
    """Values that are each fine but cannot go together on this machine (e.g. DataParallel with apex's
    patched forward): refused before anything starts, and a `skipped` row with the reason in a sweep."""


def _show(value: object) -> str:
    if isinstance(value, list | tuple):
        return "[" + ",".join(_show(v) for v in value) + "]"
    return "null" if value is None else str(value)


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def check_group_choices(overrides: Sequence[str], conf_dir: Path = CONF_DIR) -> None:
    """Refuse `strategy=nope` before Hydra composes (its own error is many lines and exit 1)."""
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if not sep or key not in CONFIG_GROUPS:
            continue
        options = group_options(key, conf_dir)
        for choice in _split_sweep(value):
            if choice not in options and choice != "null":
                raise ConfigError(key, choice, "one of " + ", ".join(options))


RUN_MARKERS = ("results.json", ".hydra", "ranks", "multirun.yaml")  # what a started run or sweep leaves


def check_output_dirs(overrides: Sequence[str]) -> None:
    """A run never lands in a folder that already holds one (finished or not): refuse before Hydra
    writes into it."""
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and key in ("hydra.run.dir", "hydra.sweep.dir") and "${" not in value and Path(value).is_dir():
            held = next((p for marker in RUN_MARKERS for p in Path(value).rglob(marker)), None)
            if held is not None:
                raise ConfigError(key, value, f"a folder that holds no run yet ({held} exists); "
                                  "every run gets a folder of its own")


def _split_sweep(value: str) -> list[str]:
    """`a,b` in a multirun override means two choices; anything fancier is left to Hydra."""
    if any(c in value for c in "()[]{}"):
        return []
    return [v.strip() for v in value.split(",") if v.strip()]


@dataclass(frozen=True)
class AmpConfig:
    level: str
    impl: str = "native"
    dtype: str = "auto"
    loss_scale: str | float = "auto"
    keep_batchnorm_fp32: bool | str = "auto"
    master_weights: bool | str = "auto"
    allow_emulated: bool = False  # time half precision on a CPU without native kernels for it anyway


@dataclass(frozen=True)
class PrecisionSpec:
    """An amp level with every `auto` decided for the accelerator in use (apex's table, made explicit)."""

    level: str
    impl: str
    dtype: str  # the half type; "float32" for O0
    cast_model: bool  # O2/O3: the model's weights are half
    autocast: bool  # O1: per-op casting
    keep_batchnorm_fp32: bool
    master_weights: bool
    loss_scale: str | float  # "dynamic" or a static number; 1.0 means no scaling
    allow_emulated: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


_LEVEL_TABLE: dict[str, dict[str, Any]] = {
    # level: cast_model, autocast, keep_batchnorm_fp32, master_weights, loss_scale (for float16)
    "O0": dict(cast_model=False, autocast=False, keep_batchnorm_fp32=True, master_weights=False, loss_scale=1.0),
    "O1": dict(cast_model=False, autocast=True, keep_batchnorm_fp32=True, master_weights=False, loss_scale="dynamic"),
    "O2": dict(cast_model=True, autocast=False, keep_batchnorm_fp32=True, master_weights=True, loss_scale="dynamic"),
    "O3": dict(cast_model=True, autocast=False, keep_batchnorm_fp32=False, master_weights=False, loss_scale=1.0),
}


def resolve_precision(amp: AmpConfig, accelerator: str) -> PrecisionSpec:
    row = dict(_LEVEL_TABLE[amp.level])
    dtype = amp.dtype if amp.dtype != "auto" else ("float16" if accelerator == "cuda" else "bfloat16")
    for key in ("keep_batchnorm_fp32", "master_weights"):
        value = getattr(amp, key)
        if value == "auto":
            continue
        if not row["cast_model"] and value != row[key]:
            raise ConfigError(f"amp.{key}", value, f"auto for {amp.level}; it only applies to O2 and O3")
        row[key] = value
    if amp.loss_scale != "auto":
        row["loss_scale"] = amp.loss_scale
    elif dtype == "bfloat16":
        row["loss_scale"] = 1.0  # bfloat16 has fp32's range: nothing to scale
    if amp.level == "O0":
        dtype, row["loss_scale"] = "float32", 1.0
    return PrecisionSpec(level=amp.level, impl=amp.impl, dtype=dtype, allow_emulated=amp.allow_emulated, **row)


@dataclass(frozen=True)
class DataConfig:
    name: str
    image_size: int
    num_classes: int


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0


@dataclass(frozen=True)
class MemoryConfig:
    enabled: bool = True
    interval_ms: float = 100


@dataclass(frozen=True)
class DistConfig:
    timeout_s: float = 60
    start_timeout_s: float = 120


@dataclass(frozen=True)
class TimingConfig:
    """`iterations=auto`: time windows until the steady-state median is known to `precision_pct` (the 95 %
    confidence interval's half-width, relative to the median), or until `max_seconds` in the loop."""

    precision_pct: float = 2.0
    max_seconds: float = 120.0


@dataclass(frozen=True)
class LauncherConfig:
    """How worker processes are started (both give the same workers the same trainer)."""

    name: str = "elastic"
    start_method: str = "spawn"


@dataclass(frozen=True)
class FaultConfig:
    """Debugging aid: make `rank` fail at iteration `at_iter` (kind null = off)."""

    kind: str | None = None
    rank: int = 0
    at_iter: int = 1


@dataclass(frozen=True)
class RunConfig:
    strategy: Mapping[str, Any]
    amp: AmpConfig
    model: Mapping[str, Any]
    data: DataConfig
    gpus: tuple[int, ...] | None
    nprocs: int
    batch_size: int
    iterations: int | None  # None: iterations=auto (see TimingConfig)
    log_every: int
    warmup_windows: int
    seed: int
    repeat: int = 1
    optim: OptimConfig = field(default_factory=OptimConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)

    @property
    def strategy_name(self) -> str:
        return str(self.strategy["name"])

    @property
    def model_name(self) -> str:
        return str(self.model["name"])

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> RunConfig:
        """Checks that need no hardware: types, ranges and the relations between keys."""
        amp = AmpConfig(**_pick(cfg["amp"], AmpConfig, "amp"))
        _one_of("amp.level", amp.level, AMP_LEVELS)
        _one_of("amp.impl", amp.impl, AMP_IMPLS)
        _one_of("amp.dtype", amp.dtype, (*HALF_DTYPES, "auto"))
        if amp.loss_scale not in ("auto", "dynamic"):
            if isinstance(amp.loss_scale, bool) or not isinstance(amp.loss_scale, int | float) \
                    or not math.isfinite(amp.loss_scale) or amp.loss_scale <= 0:
                raise ConfigError("amp.loss_scale", amp.loss_scale, "dynamic, auto or a positive number")
        for key in ("keep_batchnorm_fp32", "master_weights"):
            if getattr(amp, key) not in (True, False, "auto"):
                raise ConfigError(f"amp.{key}", getattr(amp, key), "true, false or auto")
        if not isinstance(amp.allow_emulated, bool):
            raise ConfigError("amp.allow_emulated", amp.allow_emulated, "true or false")

        data = DataConfig(**_pick(cfg["data"], DataConfig, "data"))
        _positive_int("data.image_size", data.image_size)
        _positive_int("data.num_classes", data.num_classes)

        gpus = cfg.get("gpus")
        if gpus is not None:
            if isinstance(gpus, str | int) or not isinstance(gpus, Sequence):
                raise ConfigError("gpus", gpus, "a list of GPU ids such as [0,1,3], [] for CPU, or null for all")
            for g in gpus:
                if isinstance(g, bool) or not isinstance(g, int) or g < 0:
                    raise ConfigError("gpus", list(gpus), "non-negative integer GPU ids such as [0,1,3]")
            if len(set(gpus)) != len(gpus):
                raise ConfigError("gpus", list(gpus), "each GPU id at most once")
            gpus = tuple(gpus)

        for key in ("nprocs", "batch_size", "log_every"):
            _positive_int(key, cfg[key])
        _positive_int("repeat", cfg.get("repeat", 1))
        if isinstance(cfg["warmup_windows"], bool) or not isinstance(cfg["warmup_windows"], int) \
                or cfg["warmup_windows"] < 0:
            raise ConfigError("warmup_windows", cfg["warmup_windows"], "an integer >= 0")
        iterations = None if cfg["iterations"] == "auto" else cfg["iterations"]
        if iterations is not None:
            every, least = cfg["log_every"], (cfg["warmup_windows"] + 1) * cfg["log_every"]
            if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < least \
                    or iterations % every:
                raise ConfigError("iterations", iterations, f"auto, or a multiple of log_every ({every}) of at least "
                                  f"{least}: (warmup_windows + 1) x log_every, so that one window is steady")
        timing = TimingConfig(**_pick(cfg.get("timing") or {}, TimingConfig, "timing"))
        for key in ("precision_pct", "max_seconds"):
            value = getattr(timing, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ConfigError(f"timing.{key}", value, "a number > 0")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if cfg["nprocs"] > OVERSUBSCRIBE_FACTOR * cores:
            raise ConfigError("nprocs", cfg["nprocs"], f"1 to {OVERSUBSCRIBE_FACTOR * cores} on this machine "
                              f"({cores} cores)")

        memory = MemoryConfig(**_pick(cfg.get("memory", {}), MemoryConfig, "memory"))
        if isinstance(memory.interval_ms, bool) or not isinstance(memory.interval_ms, int | float) \
                or memory.interval_ms <= 0:
            raise ConfigError("memory.interval_ms", memory.interval_ms, "a number of milliseconds > 0")
        dist = DistConfig(**_pick(cfg.get("dist", {}), DistConfig, "dist"))
        for key in ("timeout_s", "start_timeout_s"):
            value = getattr(dist, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"dist.{key}", value, "a number of seconds > 0")
        seed = cfg.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError("seed", seed, "an integer")
        launcher = LauncherConfig(**_pick(cfg.get("launcher") or {}, LauncherConfig, "launcher"))
        _one_of("launcher.name", launcher.name, LAUNCHERS)
        _one_of("launcher.start_method", launcher.start_method, START_METHODS)
        fault = FaultConfig(**_pick(cfg.get("fault") or {}, FaultConfig, "fault"))
        if fault.kind is not None:
            _one_of("fault.kind", fault.kind, FAULT_KINDS)
            if not isinstance(fault.rank, int) or fault.rank < 0:
                raise ConfigError("fault.rank", fault.rank, "a rank >= 0")
            if isinstance(fault.at_iter, bool) or not isinstance(fault.at_iter, int) or fault.at_iter < 1 \
                    or (iterations is not None and fault.at_iter > iterations):
                raise ConfigError("fault.at_iter", fault.at_iter, f"1 to iterations ({cfg['iterations']})")

        return cls(
            strategy=dict(cfg["strategy"]), amp=amp, model=dict(cfg["model"]), data=data, gpus=gpus,
            nprocs=cfg["nprocs"], batch_size=cfg["batch_size"], iterations=iterations,
            log_every=cfg["log_every"], warmup_windows=cfg["warmup_windows"], seed=seed,
            repeat=cfg.get("repeat", 1),
            optim=OptimConfig(**_pick(cfg.get("optim", {}), OptimConfig, "optim")), memory=memory, dist=dist,
            fault=fault, launcher=launcher, timing=timing,
        )


def _pick(section: Mapping[str, Any], record: type, prefix: str) -> dict[str, Any]:
    names = set(record.__dataclass_fields__)
    unknown = sorted(set(section) - names)
    if unknown:
        raise ConfigError(f"{prefix}.{unknown[0]}", section[unknown[0]], "one of the keys " + ", ".join(sorted(names)))
    return {k: v for k, v in section.items() if k in names}


def _one_of(key: str, value: object, allowed: Sequence[object]) -> None:
    if value not in allowed:
        raise ConfigError(key, value, "one of " + ", ".join(str(a) for a in allowed))


def _positive_int(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, value, "an integer >= 1")
