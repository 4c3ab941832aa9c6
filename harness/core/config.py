"""Typed records for one run, built from the composed config, and every check on its values.

Each default is written here once: `hydra_defaults()` turns these records' defaults into the node Hydra composes
first (`harness_defaults` in Hydra's ConfigStore, registered by harness.compose), so conf/config.yaml holds
only Hydra's own settings and conf/<group>/ the choices. A default that depends on the machine or on the
environment is written with `on_hardware` or `from_env`: the Python value beside the `${...}` Hydra resolves.

Nothing here needs hardware: `RunConfig.from_dict` refuses an unknown key, a value of the wrong type or
out of range, in one line naming the key, the value and what is allowed (ConfigError). Plugin sections
(strategy, model, optim, amp) are checked against their plugin's own signature (harness.core.options). Where
the run can go on this machine is decided after, by harness.launch.placement.place.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from harness.core.amp_levels import LEVELS, AmpConfig
from harness.core.defaults import from_env, hydra_defaults, on_hardware
from harness.core.errors import ConfigError, unknown_key
from harness.core.options import check_plugin, check_record

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# Allowed values are the fields' Literal types: check_record refuses anything else ("one of ..."), naming the key
FaultKind = Literal["raise", "exit", "oom"]
LauncherName = Literal["elastic", "spawn"]
StartMethod = Literal["spawn", "fork", "forkserver"]
DataSource = Literal["synthetic", "loader", "tokens", "custom"]
TokenDtype = Literal["uint16", "uint32", "int32", "int64"]
SampleKind = Literal["images", "tokens", "samples"]
ParityReference = Literal["O0", "same_amp"]
Calibration = Literal["strategy", "model"]
OVERSUBSCRIBE_FACTOR = 4  # nprocs beyond this many per core is refused as a typo, not a benchmark


DATA_SOURCES: tuple[str, ...] = get_args(DataSource)




@dataclass(frozen=True)
class DataConfig:
    """`synthetic`: a pool of random global batches made once on the device, cycled: input loading never limits
    the measurement, and every strategy trains on the same data (each rank on its shard of every batch).
    `loader`: a real input pipeline, a DataLoader decoding and transforming images on the CPU every step (PIL
    images through RandomResizedCrop / ToTensor / Normalize), sharded per rank by DistributedSampler; each
    window records how long the loop waited for it (data_wait_s). `tokens`: windows of real token ids read from
    a local file every step, for a language model (harness/rank/token_file.py). Each source's keys are `data_defaults(name)`,
    which conf/data/<name>.yaml composes."""

    name: DataSource
    image_size: int = on_hardware(224, 32)
    num_classes: int = on_hardware(1000, 10)
    pool: int = 8  # synthetic: distinct global batches, cycled
    root: str | None = None  # loader: a folder of class sub-folders (torchvision ImageFolder); null = FakeData
    size: int = 2048  # loader, FakeData: images in an epoch (each rank reads its share of every epoch)
    num_workers: int = 2  # loader processes per rank (0: load in the training process itself)
    pin_memory: bool = on_hardware(True, False)
    prefetch_factor: int = 2  # batches each worker loads ahead (with num_workers > 0)
    persistent_workers: bool = True  # keep the workers between epochs (with num_workers > 0)
    item_delay_ms: float = 0.0  # loader, debugging aid: sleep this long per image (a slow disk or decoder)
    # custom: the user's batch factory, `_target_` in the config: (n, generator) -> (inputs, targets) on the CPU
    target: str | None = None
    sample: SampleKind = "samples"  # custom: what one sample counts as (throughput per sample, tokens/s for tokens)
    tokens_per_sample: int | None = None  # custom, sample=tokens: the tokens in one sample
    file: str | None = None  # tokens: a flat file of token ids, .npy or raw binary (harness/rank/token_file.py)
    token_dtype: TokenDtype = "uint16"  # tokens, raw binary: the ids' type (nanoGPT's prepare.py writes uint16)


# keys that mean something to one source only: given to the other, they would be silently ignored
DATA_ONLY = {"synthetic": ("pool",), "loader": ("root", "size", "num_workers", "pin_memory", "prefetch_factor",
                                                 "persistent_workers", "item_delay_ms"),
             "tokens": ("file", "token_dtype"),
             "custom": ("pool", "target", "sample", "tokens_per_sample")}
TARGET_KEY = "_target_"  # data=custom's batch factory, as the config spells it (DataConfig.target)


def data_defaults(source: str) -> dict[str, Any]:
    """A data source's keys and their defaults (conf/data/<source>.yaml composes them as `_<source>`); data=custom's
    `_target_` and data=tokens' `file` are the user's to give (`???`: Hydra refuses a run without them)."""
    node = hydra_defaults(DataConfig)
    keys = {k: node[k] for k in ("image_size", "num_classes", *DATA_ONLY[source]) if k != "target"}
    mandatory = {"custom": {TARGET_KEY: "???"}, "tokens": {"file": "???"}}.get(source, {})
    return {"name": source, **keys, **mandatory}


@dataclass(frozen=True)
class MemoryConfig:
    """Per-GPU memory and its PIDs (NVML), or each worker's resident memory on CPU (psutil), sampled while the
    run goes."""

    enabled: bool = True
    interval_ms: float = 100


@dataclass(frozen=True)
class DistConfig:
    timeout_s: float = 60  # collective timeout: a dead peer surfaces within this bound
    start_timeout_s: float = 120  # the workers' rendezvous


@dataclass(frozen=True)
class TimingConfig:
    """`iterations=auto`: time windows until the steady-state median is known to `precision_pct` (the 95 %
    confidence interval's half-width, relative to the median), or until `max_seconds` in the loop."""

    precision_pct: float = 2.0  # half-width of the median's 95 % confidence interval, in % of the median
    max_seconds: float = on_hardware(300.0, 120.0)
    # a racing sweep's rounds (harness.verdict, docs/verdict.md): planned after the second to fit it, each
    # started only if it fits
    budget_s: float = on_hardware(3600.0, 170.0)
    busy_share: float = 0.2  # of the cores, taken by other processes during a run's windows: the run is busy


@dataclass(frozen=True)
class LauncherConfig:
    """How worker processes are started (both give the same workers the same trainer): a choice of
    conf/launcher/, which holds each one's start method."""

    name: LauncherName
    start_method: StartMethod


@dataclass(frozen=True)
class ReportConfig:
    baseline: str | None = None  # speedups against this strategy:amp row (default: single:O0, else the first)


@dataclass(frozen=True)
class VerdictConfig:
    """How the verdict words a pair (harness.verdict.rule): `equivalent` when a ratio's interval lies within
    +-margin. 5 %: the smallest difference worth switching how one trains for (TorchBench's smallest regression
    threshold; run-to-run swings on a shared machine are 5-9 %), and one a sweep can still show."""

    margin: float = 0.05


def check_baseline_form(key: str, value: str) -> None:
    """`strategy` or `strategy:level`: which row speedups are against."""
    strategy, colon, level = value.partition(":")
    if not strategy or (colon and level not in LEVELS):
        raise ConfigError(key, value, f"strategy:amp, e.g. single:O0 or ddp (amp one of {', '.join(LEVELS)})")




@dataclass(frozen=True)
class ParityConfig:
    """Numerical parity (off by default, so timing runs are untouched): after the timed loop every rank
    records a digest of its trained parameters, rank 0 keeps the parameters and the loss of every
    iteration, and the report compares them with `strategy=single` at O0 (`reference: same_amp`: at the
    run's own amp level). `parity=true` on the command line is short for `parity.enabled=true`."""

    enabled: bool = False
    reference: ParityReference = "O0"


@dataclass(frozen=True)
class PlanConfig:
    """Predictions before launch (harness.plan). `plan=true` on the command line is short for
    `plan.enabled=true`: predict every combination on `hardware` (a conf/plan/hardware/ preset) and train
    nothing. Otherwise every run is predicted on this machine first; one predicted not to fit its device
    memory is skipped unless `enforce` is false."""

    enabled: bool = False
    hardware: str = "local"  # a preset of conf/plan/hardware/ (local: this machine, measured; h100x8, ...) or a .yaml file
    # how many of the preset's nodes (0: as many as the preset has): h100x8 with nodes=8 is 64 GPUs, joined by the
    # preset's `inter` link
    nodes: int = 0
    enforce: bool = True
    # every run predicted on this machine before it starts (false: none, and nothing skipped)
    predict: bool = from_env("HARNESS_PLAN_PREDICT", True)
    # this machine's compute, measured through the strategy in a process group of one (a child process), or
    # `model`: the bare model, in-process
    calibration: Calibration = from_env("HARNESS_PLAN_CALIBRATION", "strategy")


SearchAxis = Literal["strategy", "amp", "micro_batch", "bucket", "comm_hook", "compile", "checkpoint"]
SEARCH_AXES: tuple[str, ...] = get_args(SearchAxis)
_CPU_SEARCH_AXES = ("strategy", "amp", "micro_batch")


@dataclass(frozen=True)
class SearchConfig:
    """`python run.py -m search=true` (short for `search.enabled=true`): the fastest configuration without running
    the grid (harness.search, docs/search.md). `axes`: what is searched (harness.search.space's AXES), crossed
    with what the command line sweeps; a typed key is fixed. `prune_factor`: combinations predicted slower than
    the best prediction by more than this (at the fast end of their band) are not run. `budget_s`: the racing's
    time budget (timing.budget_s of the search)."""

    enabled: bool = False
    # on a CPU the first three (24 combinations): a CPU run costs seconds, and the full space's 60 and more would
    # take longer to run once than the search is worth; compile there costs more than the run it would speed up
    axes: list[str] = field(default_factory=lambda: list(_CPU_SEARCH_AXES), metadata={
        "hydra": f"${{hw:{list(SEARCH_AXES)},{list(_CPU_SEARCH_AXES)}}}"})
    prune_factor: float = 2.0
    budget_s: float = on_hardware(3600.0, 300.0)


MatmulPrecision = Literal["highest", "high", "medium"]


@dataclass(frozen=True)
class KernelsConfig:
    """How the device picks its kernels, as training scripts set it; every run records what torch had
    (results.json `kernels`) and the report names it. `cudnn_benchmark`: cuDNN times its convolution algorithms on
    the first shapes and keeps the fastest (NVIDIA DeepLearningExamples' ResNet-50 sets it; no effect on CPU).
    `channels_last`: convolutional models and their image batches in NHWC (the layout tensor cores and cuDNN's
    fastest kernels take; DeepLearningExamples trains ResNet-50 so with AMP), on GPUs by default. `matmul_precision`:
    torch.set_float32_matmul_precision, torch's default `highest` (no TF32 for float32 matmuls; cuDNN convolutions
    use TF32 by default either way); `high` lets float32 matmuls use TF32 on Ampere and later."""

    cudnn_benchmark: bool = True
    channels_last: bool = on_hardware(True, False)
    matmul_precision: MatmulPrecision = "highest"


@dataclass(frozen=True)
class FaultConfig:
    """Debugging aid: make `rank` fail at iteration `at_iter` (kind null = off)."""

    kind: FaultKind | None = None  # null: off
    rank: int = 0
    at_iter: int = 1


@dataclass(frozen=True)
class RunConfig:
    """One run's config. The fields up to `launcher` are the choices of conf/<group>/ (no default here); every
    other default is this record's, and Hydra composes it from here (hydra_defaults)."""

    strategy_name: str  # the conf/strategy/ choice (passed in: a derived value, not a config key)
    strategy: Mapping[str, Any]  # the strategy plugin's options, `_target_` included
    amp: AmpConfig
    amp_plugin: str  # the amp plugin class conf/amp names with `_target_`
    model: Mapping[str, Any]
    optim: Mapping[str, Any]  # `_target_` + `_partial_`: called with the parameters to train
    data: DataConfig
    launcher: LauncherConfig
    gpus: tuple[int, ...] | None = None  # CUDA ids, e.g. [0,1,3]; null = every visible GPU (CPU if none); [] = CPU
    nprocs: int = 2  # worker processes on CPU (one per GPU on GPUs)
    batch_size: int = on_hardware(128, 32)  # the GLOBAL batch; DDP ranks get batch_size / world_size each
    # None: iterations=auto (see TimingConfig). CPU: 40 (60 with profile=true), so the default sweep's rounds
    # fit in three minutes
    iterations: int | None = on_hardware(100, 40, hydra="${hw:100,${cpu_iterations:${profile}}}")
    log_every: int = 20
    warmup_windows: int = 1
    seed: int = 0
    repeat: int | None = None  # a sweep's rounds (None: racing decides); a single run: this many times
    round: int | None = None  # set by the sweep: which of its rounds this run is
    place: int | None = None  # set by the sweep: the run's place in its round (1: first)
    after: int | None = None  # set by the sweep: the combination (its job number) that ran just before it
    compile: bool = False  # torch.compile the model (compilation timed apart, before the clock)
    grad_accum: int = 1  # micro-batches per optimizer step; the global batch stays batch_size
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    verdict: VerdictConfig = field(default_factory=VerdictConfig)
    parity: ParityConfig = field(default_factory=ParityConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    profile: bool = False  # torch.profiler over the first window after warm-up (excluded from steady figures)

    @property
    def model_name(self) -> str:
        return str(self.model.get("name") or str(self.model["_target_"]).rpartition(".")[2])

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any], strategy_name: str) -> RunConfig:
        """Checks that need no hardware: keys, types, ranges and the relations between keys."""
        unknown = sorted(set(cfg) - TOP_LEVEL_KEYS)
        if unknown:
            raise ConfigError(unknown[0], cfg[unknown[0]], unknown_key(unknown[0], TOP_LEVEL_KEYS))
        cfg = {**TOP_LEVEL_DEFAULTS, **cfg}  # a config composed without Hydra (tests, benchmarks) gets the same
        check_plugin("strategy", cfg["strategy"])
        check_plugin("model", cfg["model"], provided=("num_classes",))
        check_plugin("optim", cfg["optim"])
        amp_section = dict(cfg["amp"])
        amp_plugin = amp_section.pop("_target_", None)
        if not isinstance(amp_plugin, str):
            raise ConfigError("amp._target_", amp_plugin, "the amp plugin class (amp._target_, from amp.impl)")
        amp = AmpConfig(**check_record("amp", amp_section, AmpConfig))

        data = check_data(cfg["data"], cfg["batch_size"])

        gpus = check_gpus(cfg.get("gpus"))
        check_nprocs(cfg["nprocs"])
        for key in ("batch_size", "log_every"):
            _positive_int(key, cfg[key])
        for key in ("repeat", "round", "place"):
            if cfg.get(key) is not None:
                _positive_int(key, cfg[key])
        if cfg.get("after") is not None and (isinstance(cfg["after"], bool) or not isinstance(cfg["after"], int)
                                             or cfg["after"] < 0):
            raise ConfigError("after", cfg["after"], "a combination's job number (an integer >= 0), set by the sweep")
        if isinstance(cfg["warmup_windows"], bool) or not isinstance(cfg["warmup_windows"], int) \
                or cfg["warmup_windows"] < 0:
            raise ConfigError("warmup_windows", cfg["warmup_windows"], "an integer >= 0")
        profile = cfg["profile"]
        if not isinstance(profile, bool):
            raise ConfigError("profile", profile, "true or false")
        if profile and cfg["warmup_windows"] < 1:
            raise ConfigError("warmup_windows", cfg["warmup_windows"], "at least 1 with profile=true (the "
                              "profiled window is the first after warm-up)")
        parity = check_parity(cfg.get("parity"))
        iterations = None if cfg["iterations"] == "auto" else cfg["iterations"]
        if iterations is not None:
            every, extra = cfg["log_every"], (2 if profile else 1)
            least = (cfg["warmup_windows"] + extra) * every
            why = ("(warmup_windows + 2) x log_every with profile=true, so that one window besides the profiled one "
                   "is steady") if profile else "(warmup_windows + 1) x log_every, so that one window is steady"
            if parity.enabled and not profile:  # a parity run compares what was trained: timing may be left out
                least, why = every, "one window at least (parity=true: with fewer than " \
                    f"{(cfg['warmup_windows'] + 1) * every} no window is steady and the run reports no timing)"
            if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < least \
                    or iterations % every:
                raise ConfigError("iterations", iterations, f"auto, or a multiple of log_every ({every}) of at least "
                                  f"{least}: {why}")
        timing = TimingConfig(**check_record("timing", cfg.get("timing") or {}, TimingConfig))
        if not 0 < timing.busy_share <= 1:
            raise ConfigError("timing.busy_share", timing.busy_share, "a share of the cores, > 0 and <= 1 (1: a run "
                              "is never counted busy)")
        for key in ("precision_pct", "max_seconds", "budget_s"):
            if not 0 < getattr(timing, key) < math.inf:
                raise ConfigError(f"timing.{key}", getattr(timing, key), "a number > 0" + (
                    " (seconds a sweep may spend on rounds after its first two)" if key == "budget_s" else ""))
        memory = MemoryConfig(**check_record("memory", cfg.get("memory") or {}, MemoryConfig))
        if memory.interval_ms <= 0:
            raise ConfigError("memory.interval_ms", memory.interval_ms, "a number of milliseconds > 0")
        dist = check_dist(cfg.get("dist") or {})
        seed = cfg["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError("seed", seed, "an integer")
        if not isinstance(cfg.get("launcher"), Mapping):
            raise ConfigError("launcher", cfg.get("launcher"), "a choice of conf/launcher/ (elastic, spawn)")
        launcher = LauncherConfig(**check_record("launcher", cfg["launcher"], LauncherConfig))
        fault = FaultConfig(**check_record("fault", cfg.get("fault") or {}, FaultConfig))
        if fault.kind is not None:
            if fault.rank < 0:
                raise ConfigError("fault.rank", fault.rank, "a rank >= 0")
            if fault.at_iter < 1 or (iterations is not None and fault.at_iter > iterations):
                raise ConfigError("fault.at_iter", fault.at_iter, f"1 to iterations ({cfg['iterations']})")
        report = ReportConfig(**check_record("report", cfg.get("report") or {}, ReportConfig))
        if report.baseline is not None:
            check_baseline_form("report.baseline", report.baseline)
        verdict = VerdictConfig(**check_record("verdict", cfg.get("verdict") or {}, VerdictConfig))
        if isinstance(verdict.margin, bool) or not isinstance(verdict.margin, int | float) \
                or not 0 < verdict.margin < 1:
            raise ConfigError("verdict.margin", verdict.margin, "a share > 0 and < 1 (0.05: equivalent within 5 %)")
        compile_ = cfg["compile"]
        if not isinstance(compile_, bool):
            raise ConfigError("compile", compile_, "true or false")
        grad_accum = cfg["grad_accum"]
        _positive_int("grad_accum", grad_accum)
        plan = check_plan(cfg.get("plan"))
        kernels = KernelsConfig(**check_record("kernels", cfg.get("kernels") or {}, KernelsConfig))
        search = check_search(cfg.get("search"))

        return cls(
            strategy_name=strategy_name, strategy=dict(cfg["strategy"]), amp=amp, amp_plugin=amp_plugin,
            model=dict(cfg["model"]), optim=dict(cfg["optim"]), data=data, gpus=gpus, nprocs=cfg["nprocs"],
            batch_size=cfg["batch_size"], iterations=iterations, log_every=cfg["log_every"],
            warmup_windows=cfg["warmup_windows"], seed=seed, repeat=cfg.get("repeat"), round=cfg.get("round"),
            place=cfg.get("place"), after=cfg.get("after"), memory=memory,
            dist=dist, fault=fault, launcher=launcher, timing=timing, report=report, verdict=verdict, parity=parity,
            compile=compile_, grad_accum=grad_accum, profile=profile, plan=plan, kernels=kernels, search=search,
        )


TOP_LEVEL_KEYS = frozenset({"strategy", "amp", "model", "optim", "data", "gpus", "nprocs", "batch_size",
                            "iterations", "log_every", "warmup_windows", "seed", "repeat", "round", "place", "after",
                            "memory", "dist",
                            "fault", "launcher", "timing", "report", "verdict", "parity", "compile", "grad_accum",
                            "profile", "plan", "kernels", "search"})
# the top-level keys' Python defaults (sections build their own from their records)
TOP_LEVEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig)
                      if f.default is not dataclasses.MISSING and f.name in TOP_LEVEL_KEYS}
CHOICES = ("strategy_name", "strategy", "amp", "amp_plugin", "model", "optim", "data", "launcher")


def run_defaults() -> dict[str, Any]:
    """The node Hydra composes before the groups' choices: every default of a run (conf/config.yaml's
    `harness_defaults`)."""
    return hydra_defaults(RunConfig, skip=CHOICES)


def check_data(section: Mapping[str, Any], batch_size: Any) -> DataConfig:
    section = dict(section)
    if TARGET_KEY in section:
        section["target"] = section.pop(TARGET_KEY)
    data = DataConfig(**check_record("data", section, DataConfig))
    if data.name == "custom":
        check_batch_factory(data)
    for name, keys in DATA_ONLY.items():
        stray = [k for k in keys if k in section and name != data.name and k not in DATA_ONLY[data.name]]
        if stray:
            raise ConfigError(f"data.{stray[0]}", section[stray[0]], f"a key of data={name} only (this run has "
                              f"data={data.name})")
    for key in ("image_size", "num_classes", "pool", "size", "prefetch_factor"):
        _positive_int(f"data.{key}", getattr(data, key))
    if isinstance(data.num_workers, bool) or data.num_workers < 0:
        raise ConfigError("data.num_workers", data.num_workers, "an integer >= 0 (0: load in the training process)")
    if not 0 <= data.item_delay_ms < math.inf:
        raise ConfigError("data.item_delay_ms", data.item_delay_ms, "a number of milliseconds >= 0")
    if data.name == "tokens" and not Path(str(data.file)).is_file():
        raise ConfigError("data.file", data.file, "a file of token ids, .npy or raw data.token_dtype (nanoGPT's "
                          "train.bin), e.g. the one `python -m examples.tokens` writes")
    if data.root is not None and not Path(data.root).is_dir():
        raise ConfigError("data.root", data.root, "a folder of class sub-folders (torchvision ImageFolder), or null "
                          "for FakeData")
    if data.name == "loader" and data.root is None and isinstance(batch_size, int) and data.size < batch_size:
        raise ConfigError("data.size", data.size, f"at least batch_size ({batch_size}) images: an epoch must hold "
                          "one global batch")
    return data


def check_batch_factory(data: DataConfig) -> None:
    """data=custom: `_target_` names a function the harness can import; tokens/s needs the tokens in a sample."""
    import pydoc

    if not data.target or not callable(pydoc.locate(data.target)):
        raise ConfigError("data._target_", data.target, "the dotted path of an importable batch factory, "
                          "(n, generator) -> (inputs, targets), e.g. examples.custom_workload.batches "
                          "(docs/workloads.md)")
    if (data.sample == "tokens") != (data.tokens_per_sample is not None):
        raise ConfigError("data.tokens_per_sample", data.tokens_per_sample, "the tokens in one sample with "
                          "data.sample=tokens, and null otherwise")
    if data.tokens_per_sample is not None:
        _positive_int("data.tokens_per_sample", data.tokens_per_sample)


def check_gpus(gpus: Any) -> tuple[int, ...] | None:
    if gpus is None:
        return None
    if isinstance(gpus, str | int) or not isinstance(gpus, Sequence):
        raise ConfigError("gpus", gpus, "a list of GPU ids such as [0,1,3], [] for CPU, or null for all")
    for g in gpus:
        if isinstance(g, bool) or not isinstance(g, int) or g < 0:
            raise ConfigError("gpus", list(gpus), "non-negative integer GPU ids such as [0,1,3]")
    if len(set(gpus)) != len(gpus):
        raise ConfigError("gpus", list(gpus), "each GPU id at most once")
    return tuple(gpus)


def check_nprocs(nprocs: Any) -> int:
    _positive_int("nprocs", nprocs)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if nprocs > OVERSUBSCRIBE_FACTOR * cores:
        raise ConfigError("nprocs", nprocs, f"1 to {OVERSUBSCRIBE_FACTOR * cores} on this machine ({cores} cores)")
    return int(nprocs)


T = TypeVar("T")


def switch_or_section(key: str, section: Any, record: type[T]) -> T:
    """`key=true|false` (the shorthand Hydra leaves as a bool) or the section itself, as its record."""
    if section is None:
        return record()
    if isinstance(section, bool):
        return record(enabled=section)
    if not isinstance(section, Mapping):
        fields = ", ".join(f"{key}.{f.name}" for f in dataclasses.fields(record))  # type: ignore[arg-type]
        raise ConfigError(key, section, f"true, false, or the section ({fields})")
    return record(**check_record(key, section, record))


def check_parity(section: Any) -> ParityConfig:
    return switch_or_section("parity", section, ParityConfig)


def check_search(section: Any) -> SearchConfig:
    """`search=true|false` (the shorthand) or the section; every axis known, none twice; a budget > 0."""
    search = switch_or_section("search", section, SearchConfig)
    check_search_axes(search.axes)
    if not 1 <= search.prune_factor < math.inf:
        raise ConfigError("search.prune_factor", search.prune_factor, "a number >= 1 (2: combinations predicted "
                          "more than twice as slow as the best are not run)")
    if not 0 < search.budget_s < math.inf:
        raise ConfigError("search.budget_s", search.budget_s, "a number of seconds > 0")
    return search


def check_search_axes(axes: Sequence[str]) -> None:
    """`search.axes`: at least one, each a known axis, none twice."""
    if not axes or len(set(axes)) != len(axes) or any(a not in SEARCH_AXES for a in axes):
        raise ConfigError("search.axes", list(axes), f"a list of distinct axes from {', '.join(SEARCH_AXES)}")


PRESET_FILE_SUFFIXES = (".yaml", ".yml")  # plan.hardware=path/to/gpu.yaml: a user's own preset file


def check_plan(section: Any) -> PlanConfig:
    """`plan=true|false` or the section. Whether `plan.hardware` names a preset, and the preset's own fields,
    are checked where presets are read (harness.plan.hardware), before anything starts."""
    plan = switch_or_section("plan", section, PlanConfig)
    own_file = str(plan.hardware).endswith(PRESET_FILE_SUFFIXES)
    if not plan.hardware or not (own_file or str(plan.hardware).replace("-", "").replace("_", "").isalnum()):
        raise ConfigError("plan.hardware", plan.hardware, "the name of a preset in conf/plan/hardware/ (letters, "
                          "digits, - and _) or a preset file of your own (path/to/gpu.yaml)")
    if isinstance(plan.nodes, bool) or not isinstance(plan.nodes, int) or plan.nodes < 0:
        raise ConfigError("plan.nodes", plan.nodes, "an integer >= 1 (or 0: the preset's own node count)")
    if plan.nodes and plan.hardware == "local":
        raise ConfigError("plan.nodes", plan.nodes, "0 with plan.hardware=local (this machine is one node); name a "
                          "preset to plan more nodes, e.g. plan.hardware=h100x8 plan.nodes=8")
    return plan


def check_dist(section: Mapping[str, Any]) -> DistConfig:
    dist = DistConfig(**check_record("dist", section, DistConfig))
    for key in ("timeout_s", "start_timeout_s"):
        if not getattr(dist, key) > 0:
            raise ConfigError(f"dist.{key}", getattr(dist, key), "a number of seconds > 0")
    return dist


def _positive_int(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, value, "an integer >= 1")
