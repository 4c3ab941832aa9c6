"""Typed records for one run, built from the composed config, and every check on its values.

Each key is written here once, as its record's field (harness.core.defaults' `option`): its type, its default, its
range or rule, and its help (docs/config.md's table is generated from it: `python -m harness.core.config_docs`).
`hydra_defaults()` turns these records' defaults into the node Hydra composes first (`harness_defaults` in Hydra's
ConfigStore, registered by harness.compose), with every `Literal` field an Enum-typed node, so that composing a bad
choice already fails; conf/config.yaml holds only Hydra's own settings and conf/<group>/ the choices. A default
that depends on the machine or on the environment is written with `on_hardware` or `from_env`: the Python value
beside the `${...}` Hydra resolves.

Nothing here needs hardware: `RunConfig.from_dict` reads every key by its field (harness.core.options'
`read_record`: an unknown key, a value of the wrong type, out of range or against its rule refused in one line
naming the key, the value and what is allowed; ConfigError), then checks the relations between keys. Plugin
sections (strategy, model, optim) are checked against their plugin's own signature (harness.core.options), amp by
AmpConfig. Where the run can go on this machine is decided after, by harness.launch.placement.place.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from harness.core.amp_levels import LEVELS, AmpConfig
from harness.core.checkpointing import split_model_options
from harness.core.defaults import Check, from_env, hydra_defaults, on_hardware, option
from harness.core.errors import ConfigError
from harness.core.options import check_plugin, literal_node, read_record, read_value

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# Allowed values are the fields' Literal types: read_record refuses anything else ("one of ..."), naming the key,
# and Hydra refuses it already while composing (an Enum-typed node, harness.core.options.literal_node)
FaultKind = Literal["raise", "exit", "oom"]
LauncherName = Literal["elastic", "spawn"]
StartMethod = Literal["spawn", "fork", "forkserver"]
DataSource = Literal["synthetic", "loader", "tokens", "custom"]
TokenDtype = Literal["uint16", "uint32", "int32", "int64"]
SampleKind = Literal["images", "tokens", "samples"]
ParityReference = Literal["O0", "same_amp"]
Calibration = Literal["strategy", "model"]
MatmulPrecision = Literal["highest", "high", "medium"]
SearchAxis = Literal["strategy", "amp", "micro_batch", "bucket", "comm_hook", "compile", "checkpoint"]
OVERSUBSCRIBE_FACTOR = 4  # nprocs beyond this many per core is refused as a typo, not a benchmark
PRESET_FILE_SUFFIXES = (".yaml", ".yml")  # plan.hardware=path/to/gpu.yaml: a user's own preset file

DATA_SOURCES: tuple[str, ...] = get_args(DataSource)
SEARCH_AXES: tuple[str, ...] = get_args(SearchAxis)
_CPU_SEARCH_AXES = ["strategy", "amp", "micro_batch"]


# ---- the rules of single keys (a field's `check`, run after its type and range) ----

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
    """At least one, and not so many per core that it can only be a typo."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ConfigError("nprocs", nprocs, "an integer >= 1")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if nprocs > OVERSUBSCRIBE_FACTOR * cores:
        raise ConfigError("nprocs", nprocs, f"1 to {OVERSUBSCRIBE_FACTOR * cores} on this machine ({cores} cores)")
    return int(nprocs)


def check_baseline_form(key: str, value: str) -> None:
    """`strategy` or `strategy:level`: which row speedups are against."""
    strategy, colon, level = value.partition(":")
    if not strategy or (colon and level not in LEVELS):
        raise ConfigError(key, value, f"strategy:amp, e.g. single:O0 or ddp (amp one of {', '.join(LEVELS)})")


def check_search_axes(axes: Sequence[str]) -> None:
    """`search.axes`: at least one, each a known axis, none twice."""
    if not axes or len(set(axes)) != len(axes) or any(a not in SEARCH_AXES for a in axes):
        raise ConfigError("search.axes", list(axes), f"a list of distinct axes from {', '.join(SEARCH_AXES)}")


def _plugin(*provided: str) -> Check:
    """A plugin section against its plugin's signature; `provided`: the arguments the harness passes itself."""
    return lambda key, section: check_plugin(key, section, provided=provided)


def _model(key: str, section: Mapping[str, Any]) -> None:
    """The model's section against its factory's signature (a classifier's num_classes passed by the harness),
    less `checkpoint` where the harness takes it (a factory without it: harness.core.checkpointing), whose mode is
    checked here."""
    check_plugin(key, split_model_options(section, key)[0], provided=("num_classes",))


def _baseline(key: str, value: str | None) -> None:
    if value is not None:
        check_baseline_form(key, value)


def _axes(key: str, axes: list[str]) -> None:
    check_search_axes(axes)


def _folder(key: str, root: str | None) -> None:
    if root is not None and not Path(root).is_dir():
        raise ConfigError(key, root, "a folder of class sub-folders (torchvision ImageFolder), or null for FakeData")


def _preset(key: str, hardware: str) -> None:
    """Whether `plan.hardware` names a preset, and the preset's own fields, are checked where presets are read
    (harness.prediction.hardware), before anything starts; here only its form."""
    own_file = hardware.endswith(PRESET_FILE_SUFFIXES)
    if not hardware or not (own_file or hardware.replace("-", "").replace("_", "").isalnum()):
        raise ConfigError(key, hardware, "the name of a preset in conf/plan/hardware/ (letters, digits, - and _) or a "
                          "preset file of your own (path/to/gpu.yaml)")


# ---- the records ----

@dataclass(frozen=True)
class DataConfig:
    """`synthetic`: a pool of random global batches made once on the device, cycled: input loading never limits
    the measurement, and every strategy trains on the same data (each rank on its shard of every batch).
    `loader`: a real input pipeline, a DataLoader decoding and transforming images on the CPU every step (PIL
    images through RandomResizedCrop / ToTensor / Normalize), sharded per rank by DistributedSampler; each
    window records how long the loop waited for it (data_wait_s). `tokens`: windows of real token ids read from
    a local file every step, for a language model (harness/rank/token_file.py). Each source's keys are
    `data_defaults(name)`, which conf/data/<name>.yaml composes."""

    name: DataSource
    image_size: int = on_hardware(224, 32, ge=1, help="every source: the images' side")
    num_classes: int = on_hardware(1000, 10, ge=1, help="every source: the classes (for models fed images; "
                                   "`model=vit` and `model=gpt` say their own inputs)")
    pool: int = option(8, "synthetic, custom: distinct global batches made once, cycled", ge=1)
    root: str | None = option(None, "loader: a folder of class sub-folders (torchvision `ImageFolder`); `null`: "
                              "torchvision `FakeData`", check=_folder)
    size: int = option(2048, "loader, `FakeData`: images in an epoch (each rank reads its share of every epoch)", ge=1)
    num_workers: int = option(2, "loader: processes per rank (0: load in the training process itself)", ge=0,
                              allowed="an integer >= 0 (0: load in the training process)")
    pin_memory: bool = on_hardware(True, False, help="loader: batches in page-locked memory")
    prefetch_factor: int = option(2, "loader: batches each worker loads ahead (with num_workers > 0)", ge=1)
    persistent_workers: bool = option(True, "loader: keep the workers between epochs (with num_workers > 0)")
    item_delay_ms: float = option(0.0, "loader, debugging aid: sleep this long per image (a slow disk or decoder)",
                                  ge=0, lt=math.inf, allowed="a number of milliseconds >= 0")
    target: str | None = option(None, "custom: your batch factory's dotted path, `(n, generator) -> (inputs, "
                                "targets)` on the CPU ([workloads](workloads.md))", key="_target_")
    sample: SampleKind = option("samples", "custom: what one sample counts as (throughput per sample; tokens/s for "
                                "`tokens`)")
    tokens_per_sample: int | None = option(None, "custom, `data.sample=tokens`: the tokens in one sample", ge=1)
    file: str | None = option(None, "tokens: a flat file of token ids, `.npy` or raw binary "
                              "([workloads](workloads.md))")
    token_dtype: TokenDtype = option("uint16", "tokens, raw binary: the ids' type (nanoGPT's `train.bin`: uint16)")


TARGET_KEY = "_target_"  # data=custom's batch factory, as the config spells it (DataConfig.target)
# keys that mean something to one source only: given to the other, they would be silently ignored
DATA_ONLY = {"synthetic": ("pool",), "loader": ("root", "size", "num_workers", "pin_memory", "prefetch_factor",
                                                 "persistent_workers", "item_delay_ms"),
             "tokens": ("file", "token_dtype"),
             "custom": ("pool", TARGET_KEY, "sample", "tokens_per_sample")}


def data_defaults(source: str) -> dict[str, Any]:
    """A data source's keys and their defaults (conf/data/<source>.yaml composes them as `_<source>`); data=custom's
    `_target_` and data=tokens' `file` are the user's to give (`???`: Hydra refuses a run without them)."""
    node = hydra_defaults(DataConfig, prefix="data.")
    keys = {k: node[k] for k in ("image_size", "num_classes", *DATA_ONLY[source]) if k != TARGET_KEY}
    mandatory = {"custom": {TARGET_KEY: "???"}, "tokens": {"file": "???"}}.get(source, {})
    return {"name": literal_node("data.name", DataSource, source), **keys, **mandatory}


@dataclass(frozen=True)
class MemoryConfig:
    """Per-GPU memory and its PIDs (NVML), or each worker's resident memory on CPU (psutil), sampled while the
    run goes."""

    enabled: bool = option(True, "the memory sampler: each GPU's memory and its PIDs (NVML), or each worker's "
                           "resident memory on CPU (psutil), while the run goes")
    interval_ms: float = option(100, "how often it samples", gt=0, allowed="a number of milliseconds > 0")


@dataclass(frozen=True)
class DistConfig:
    timeout_s: float = option(60, "collective timeout: a dead peer surfaces within this bound", gt=0,
                              allowed="a number of seconds > 0")
    start_timeout_s: float = option(120, "how long the workers may take to join (the rendezvous)", gt=0,
                                    allowed="a number of seconds > 0")


@dataclass(frozen=True)
class TimingConfig:
    """`iterations=auto`: time windows until the steady-state median is known to `precision_pct` (the 95 %
    confidence interval's half-width, relative to the median), or until `max_seconds` in the loop."""

    precision_pct: float = option(2.0, "`iterations=auto` goes on until the steady-state median is known to ± this % "
                                  "(the half-width of its 95 % confidence interval; [measurement](measurement.md))",
                                  gt=0, lt=math.inf)
    max_seconds: float = on_hardware(300.0, 120.0, gt=0, lt=math.inf, help="`iterations=auto` stops after this long in the loop at most")
    budget_s: float = on_hardware(3600.0, 170.0, gt=0, lt=math.inf, help="seconds a racing sweep may spend: after "
                                  "the second round its maximum of rounds is planned from it, and a round starts only "
                                  "if it is expected to end within it ([verdict](verdict.md))",
                                  allowed="a number > 0 (seconds a sweep may spend on rounds after its first two)")
    busy_share: float = option(0.2, "a run during whose steady windows other processes took this share of the "
                               "cores (or another PID 10 % of a GPU) is `busy`: left out of intervals, racing and the "
                               "verdict; 1: never ([verdict](verdict.md#a-busy-machine))", gt=0, le=1,
                               allowed="a share of the cores, > 0 and <= 1 (1: a run is never counted busy)")


@dataclass(frozen=True)
class LauncherConfig:
    """How worker processes are started (both give the same workers the same trainer): a choice of
    conf/launcher/, which holds each one's start method."""

    name: LauncherName
    start_method: StartMethod


@dataclass(frozen=True)
class ReportConfig:
    baseline: str | None = option(None, "the row speedups are against, `strategy:amp` (`null`: `single:O0`, else "
                                  "the first row); a strategy not in `conf/strategy/` or a level outside O0–O3 is "
                                  "refused before anything starts, one that did not run is named in a warning and "
                                  "the default used", check=_baseline)


@dataclass(frozen=True)
class VerdictConfig:
    """How the verdict words a pair (harness.verdict.rule): `equivalent` when a ratio's interval lies within
    +-margin. 5 %: the smallest difference worth switching how one trains for (TorchBench's smallest regression
    threshold; run-to-run swings on a shared machine are 5-9 %), and one a sweep can still show."""

    margin: float = option(0.05, "two rows whose ratio's interval lies within ±this are **equivalent** (the smallest "
                           "difference you would act on); faster or slower needs the interval to exclude 1 "
                           "([verdict](verdict.md#the-rule))", gt=0, lt=1,
                           allowed="a share > 0 and < 1 (0.05: equivalent within 5 %)")


@dataclass(frozen=True)
class ParityConfig:
    """Numerical parity (off by default, so timing runs are untouched): after the timed loop every rank
    records a digest of its trained parameters, rank 0 keeps the parameters and the loss of every
    iteration, and the report compares them with `strategy=single` at O0 (`reference: same_amp`: at the
    run's own amp level). `parity=true` on the command line is short for `parity.enabled=true`."""

    enabled: bool = option(False, "numerical parity: after the timed loop, record what each rank trained and compare "
                           "it in the report with the reference row; `parity=true` is short for this "
                           "([parity](parity.md#numerical-parity-does-each-strategy-train-the-same-model))")
    reference: ParityReference = option("O0", "the reference: `strategy=single` at `O0`, or at the row's own amp "
                                        "level (`same_amp`)")


@dataclass(frozen=True)
class PlanConfig:
    """Predictions before launch (harness.prediction). `plan=true` on the command line is short for
    `plan.enabled=true`: predict every combination on `hardware` (a conf/plan/hardware/ preset) and train
    nothing. Otherwise every run is predicted on this machine first; one predicted not to fit its device
    memory is skipped unless `enforce` is false."""

    enabled: bool = option(False, "predict every combination on `plan.hardware` and train nothing ([plan](plan.md)); "
                           "`plan=true` is short for this")
    hardware: str = option("local", "a preset of `conf/plan/hardware/` (`local`: this machine, measured; `h100x8`, "
                           "...) or a preset file of your own, `path/to/gpu.yaml`", check=_preset)
    nodes: int = option(0, "how many of the preset's nodes (0: as many as it has): `h100x8` with 8 nodes is 64 GPUs, "
                        "joined by the preset's `inter` link", ge=0,
                        allowed="an integer >= 1 (or 0: the preset's own node count)")
    enforce: bool = option(True, "skip a run predicted not to fit its device memory (false: run it anyway)")
    predict: bool = from_env("HARNESS_PLAN_PREDICT", True, help="predict every run on this machine before it starts "
                             "(false: none, and nothing skipped)")
    link_repeats: int = from_env("HARNESS_LINK_REPEATS", 100, help="calls per message size when this machine's link "
                                 "is measured (once, then cached): enough for the mean of gloo's bimodal calls (20 "
                                 "left each op's fitted latency 2-3x apart from one measurement to the next on a "
                                 "2-core VM; 100 within 20 % of each other in two)", ge=1, allowed="an integer >= 1")
    calibration: Calibration = from_env("HARNESS_PLAN_CALIBRATION", "strategy", help="this machine's compute, "
                                        "measured through the strategy in a process group of one (a child process; "
                                        "FSDP2 over the whole world as one rank of it, in a fake process group: "
                                        "docs/plan.md), or `model`: the bare model, in-process")


@dataclass(frozen=True)
class SearchConfig:
    """`python run.py -m search=true` (short for `search.enabled=true`): the fastest configuration without running
    the grid (harness.search, docs/search.md). `axes`: what is searched (harness.search.space's AXES), crossed
    with what the command line sweeps; a typed key is fixed. `prune_factor`: combinations predicted slower than
    the best prediction by more than this (at the fast end of their band) are not run. `budget_s`: the racing's
    time budget (timing.budget_s of the search)."""

    enabled: bool = option(False, "with `-m`: the fastest configuration without running the grid "
                           "([search](search.md)); `search=true` is short for this")
    # on a CPU the first three (24 combinations): a CPU run costs seconds, and the full space's 60 and more would
    # take longer to run once than the search is worth; compile there costs more than the run it would speed up
    axes: list[str] = on_hardware(list(SEARCH_AXES), _CPU_SEARCH_AXES, check=_axes,
                                  help=f"what is searched, crossed with what the command line sweeps (a typed key is "
                                  f"fixed): {', '.join(SEARCH_AXES)}")
    prune_factor: float = option(2.0, "combinations predicted slower than the best prediction by more than this (at "
                                 "the fast end of their band) are not run", ge=1, lt=math.inf,
                                 allowed="a number >= 1 (2: combinations predicted more than twice as slow as the "
                                 "best are not run)")
    budget_s: float = on_hardware(3600.0, 300.0, gt=0, lt=math.inf, allowed="a number of seconds > 0",
                                  help="the search's racing budget (its `timing.budget_s`)")


@dataclass(frozen=True)
class KernelsConfig:
    """How the device picks its kernels, as training scripts set it; every run records what torch had
    (results.json `kernels`) and the report names it. `cudnn_benchmark`: cuDNN times its convolution algorithms on
    the first shapes and keeps the fastest (NVIDIA DeepLearningExamples' ResNet-50 sets it; no effect on CPU).
    `channels_last`: convolutional models and their image batches in NHWC (the layout tensor cores and cuDNN's
    fastest kernels take; DeepLearningExamples trains ResNet-50 so with AMP), on GPUs by default. `matmul_precision`:
    torch.set_float32_matmul_precision, torch's default `highest` (no TF32 for float32 matmuls; cuDNN convolutions
    use TF32 by default either way); `high` lets float32 matmuls use TF32 on Ampere and later."""

    cudnn_benchmark: bool = option(True, "cuDNN times its convolution algorithms on the first shapes and keeps the "
                                   "fastest (NVIDIA DeepLearningExamples' ResNet-50 sets it; no effect on CPU)")
    channels_last: bool = on_hardware(True, False, help="convolutional models and their image batches in NHWC "
                                      "(DeepLearningExamples trains ResNet-50 so with AMP)")
    matmul_precision: MatmulPrecision = option("highest", "`torch.set_float32_matmul_precision`: torch's default "
                                               "`highest` (float32 matmuls without TF32); `high` allows TF32 on "
                                               "Ampere and later (cuDNN convolutions use TF32 either way)")


@dataclass(frozen=True)
class FaultConfig:
    """Debugging aid: make `rank` fail at iteration `at_iter` (kind null = off)."""

    kind: FaultKind | None = option(None, "debugging aid: make a rank `raise`, `exit` or `oom` (`null`: off)")
    rank: int = option(0, "the rank that fails")
    at_iter: int = option(1, "the iteration it fails at (1 to `iterations`)")


@dataclass(frozen=True)
class RunConfig:
    """One run's config. The fields up to `launcher` are the choices of conf/<group>/ (no default here); every
    other default is this record's, and Hydra composes it from here (hydra_defaults)."""

    strategy_name: str = option(derived=True)  # the conf/strategy/ choice (passed in: a derived value)
    strategy: Mapping[str, Any] = option(
        help="`conf/strategy/`: `single`, `ddp`, `dp`, `apex_ddp`, `allreduce`, `ignite`, `zero`, `fsdp`, ...; its "
        "options are its plugin's keyword arguments: `strategy.comm_hook=none|fp16|bf16|powersgd` (+ "
        "`strategy.powersgd_rank`, `strategy.powersgd_start_iter`) for `ddp` and `zero`; `strategy.replicate=N` for "
        "`fsdp` (HSDP: N replicas, each sharded over world/N ranks; [strategies](strategies.md))",
        allowed="a choice of conf/strategy/", check=_plugin())
    amp: AmpConfig = option(
        help="apex opt level `O0`–`O3`; `amp.impl=native|apex`, `amp.dtype`, `amp.loss_scale`, "
        "`amp.keep_batchnorm_fp32`, `amp.master_weights`, `amp.allow_emulated` (CPU without native half kernels), "
        "`amp.cpu_half=auto|native|emulated` (what the CPU is taken to have; default from `HARNESS_CPU_HALF`: "
        "[strategies](strategies.md#mixed-precision-apexs-o0o3))")
    amp_plugin: str = option(derived=True)  # the amp plugin class conf/amp names with `_target_`
    model: Mapping[str, Any] = option(
        help="`auto`: `resnet101` on GPU machines, `shufflenet_v2_x0_5` (0.35 M parameters, batch-norm) on CPU; "
        "`resnet50`, `resnet18`, `tiny_cnn` (`model.norm=none`: without batch-norm, for strict parity checks); any "
        "torchvision classification model is a yaml of a few lines in `conf/model/`; `vit`, `gpt` (a GPT-2- or "
        "Llama-shaped language model: tokens/s), `custom` (yours: `model._target_`; [workloads](workloads.md))",
        allowed="a choice of conf/model/", check=_model)
    optim: Mapping[str, Any] = option(
        help="the optimizer: `sgd` (lr 0.01, momentum 0.9), `adamw`; `optim.lr=...` and any keyword the `torch.optim` "
        "class takes (called with the parameters to train)", allowed="a choice of conf/optim/", check=_plugin())
    data: DataConfig = option(
        help="`synthetic`: random images made once on the device (`data.pool` batches, cycled): measures the "
        "strategy, not the input pipeline. `loader`: a `torch.utils.data.DataLoader` decoding and transforming PIL "
        "images on the CPU every step (`RandomResizedCrop`, `ToTensor`, `Normalize`), torchvision `FakeData` or an "
        "`ImageFolder` at `data.root`. `custom`: your own batches ([workloads](workloads.md)). `tokens`: windows of "
        "real token ids from `data.file`, for a language model ([workloads](workloads.md))")
    launcher: LauncherConfig = option(
        help="how workers are started: `elastic` (torchrun's engine) or `spawn` (`launcher.start_method`). `elastic` "
        "forks its workers from a fork server (`launcher.start_method=forkserver`) that has imported torch once and "
        "never runs anything: each run still gets processes of its own, without paying torch's import per worker "
        "(a spawned worker's start-up was 2.3–3.0 s on a 2-core machine, a forked one's 0.2–0.5 s); "
        "`launcher.start_method=spawn` starts each from scratch",
        allowed=f"a choice of conf/launcher/ ({', '.join(get_args(LauncherName))})")
    gpus: tuple[int, ...] | None = option(
        None, "CUDA ids as `nvidia-smi` numbers them, e.g. `[0,1,3]`; `null`: every visible GPU (CPU if none); `[]`: "
        "CPU", allowed="a list of non-negative integer GPU ids such as [0,1,3], [] for CPU, or null for all",
        check=lambda key, gpus: check_gpus(gpus))
    nprocs: int = option(2, "worker processes on CPU (on GPUs: one per GPU)", ge=1,
                         check=lambda key, nprocs: check_nprocs(nprocs))
    batch_size: int = on_hardware(128, 32, ge=1, help="the **global** batch: every strategy processes this many "
                                  "samples per iteration; DDP ranks get `batch_size / world_size` each")
    # None: iterations=auto (see TimingConfig). CPU: 40 (60 with profile=true), so the default sweep's rounds
    # fit in three minutes
    iterations: int | None = on_hardware(
        100, 40, hydra="${hw:100,${cpu_iterations:${profile}}}", allowed="auto, or a multiple of log_every",
        help="timed in windows of `log_every` iterations, the first `warmup_windows` warm-up; at least one window "
        "must be steady (CPU: 60 with `profile=true`). `auto`: until the median is known to `timing.precision_pct` "
        "([measurement](measurement.md))")
    log_every: int = option(20, "iterations in a timed window", ge=1)
    warmup_windows: int = option(1, "windows of warm-up, left out of the steady-state figures", ge=0)
    seed: int = option(0, "the seed of the model's weights and the data")
    repeat: int | None = option(None, "a sweep's rounds: `null`, racing decides within `timing.budget_s` (two rounds "
                                "at least, the rest planned after the second); N: exactly N rounds for every "
                                "combination, judged once at the end ([verdict](verdict.md)); a single run runs N "
                                "times. One value per sweep", ge=1)
    round: int | None = option(None, "set by the sweep, never typed: which of its rounds this run is", ge=1)
    place: int | None = option(None, "set by the sweep: the run's place in its round (1: first)", ge=1)
    after: int | None = option(None, "set by the sweep: the combination (its job number) run just before it "
                               "([verdict](verdict.md#rounds-the-unit-that-varies-is-the-run))", ge=0,
                               allowed="a combination's job number (an integer >= 0), set by the sweep")
    compile: bool = option(False, "`torch.compile` the wrapped model; compiled by one forward and backward before "
                           "the clock, timed apart (`compile_seconds`). Inductor's cache goes to "
                           "`runs/compile-cache` (or `TORCHINDUCTOR_CACHE_DIR`); a warm cache compiles in a fraction "
                           "of the time (tiny_cnn: 13.8 s cold, 1.7 s warm), so results.json records which it was")
    grad_accum: int = option(1, "micro-batches per optimizer step; the global batch stays `batch_size` (each "
                             "process's share is cut into N), every micro-batch but the last inside the strategy's "
                             "`no_sync`", ge=1)
    memory: MemoryConfig = option(MemoryConfig)
    dist: DistConfig = option(DistConfig)
    fault: FaultConfig = option(FaultConfig)
    timing: TimingConfig = option(TimingConfig)
    report: ReportConfig = option(ReportConfig)
    verdict: VerdictConfig = option(VerdictConfig)
    parity: ParityConfig = option(ParityConfig, switch=True)
    plan: PlanConfig = option(PlanConfig, switch=True)
    kernels: KernelsConfig = option(KernelsConfig)
    search: SearchConfig = option(SearchConfig, switch=True)
    profile: bool = option(False, "`torch.profiler` over the first window after warm-up on every rank; that window is "
                           "left out of the steady-state figures; a trace per rank and the breakdown "
                           "([profile](profile.md))")

    @property
    def model_name(self) -> str:
        return str(self.model.get("name") or str(self.model["_target_"]).rpartition(".")[2])

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any], strategy_name: str) -> RunConfig:
        """Every check that needs no hardware: each key by its field (type, range, rule), then the relations
        between keys."""
        section = dict(cfg)
        amp_plugin = None
        if isinstance(section.get("amp"), Mapping):  # the plugin class conf/amp names beside the level's keys
            section["amp"] = {k: v for k, v in section["amp"].items() if k != "_target_"}
            amp_plugin = cfg["amp"].get("_target_")
        if section.get("iterations") == "auto":
            section["iterations"] = None
        run = read_record("", section, cls, strategy_name=strategy_name, amp_plugin=amp_plugin)
        if not isinstance(amp_plugin, str):
            raise ConfigError("amp._target_", amp_plugin, "the amp plugin class (amp._target_, from amp.impl)")
        check_relations(run, cfg)
        return run


def run_defaults() -> dict[str, Any]:
    """The node Hydra composes before the groups' choices: every default of a run (conf/config.yaml's
    `harness_defaults`)."""
    return hydra_defaults(RunConfig)


# ---- the relations between keys, each checked once, after every key was read by its field ----

def check_relations(run: RunConfig, cfg: Mapping[str, Any]) -> None:
    check_data_relations(run.data, cfg.get("data") or {}, run.batch_size)
    if run.profile and run.warmup_windows < 1:
        raise ConfigError("warmup_windows", run.warmup_windows, "at least 1 with profile=true (the profiled window "
                          "is the first after warm-up)")
    check_iterations(run)
    fault = run.fault
    if fault.kind is not None:
        if fault.rank < 0:
            raise ConfigError("fault.rank", fault.rank, "a rank >= 0")
        if fault.at_iter < 1 or (run.iterations is not None and fault.at_iter > run.iterations):
            raise ConfigError("fault.at_iter", fault.at_iter, f"1 to iterations ({run.iterations or 'auto'})")
    check_plan_nodes(run.plan)


def check_iterations(run: RunConfig) -> None:
    """A whole number of windows, at least one of them steady (one besides the profiled one with profile=true; a
    parity run needs one window only, its timing may be left out)."""
    if run.iterations is None:
        return
    every, profile = run.log_every, run.profile
    least = (run.warmup_windows + (2 if profile else 1)) * every
    why = ("(warmup_windows + 2) x log_every with profile=true, so that one window besides the profiled one "
           "is steady") if profile else "(warmup_windows + 1) x log_every, so that one window is steady"
    if run.parity.enabled and not profile:
        least, why = every, "one window at least (parity=true: with fewer than " \
            f"{(run.warmup_windows + 1) * every} no window is steady and the run reports no timing)"
    if run.iterations < least or run.iterations % every:
        raise ConfigError("iterations", run.iterations, f"auto, or a multiple of log_every ({every}) of at least "
                          f"{least}: {why}")


def check_data_relations(data: DataConfig, section: Mapping[str, Any], batch_size: int) -> None:
    """A source's keys given to it only, data=custom's factory, data=tokens' file, an epoch of one batch at least."""
    if data.name == "custom":
        check_batch_factory(data)
    for name, keys in DATA_ONLY.items():
        stray = [k for k in keys if k in section and name != data.name and k not in DATA_ONLY[data.name]]
        if stray:
            raise ConfigError(f"data.{stray[0]}", section[stray[0]], f"a key of data={name} only (this run has "
                              f"data={data.name})")
    if data.name == "tokens" and not Path(str(data.file)).is_file():
        raise ConfigError("data.file", data.file, "a file of token ids, .npy or raw data.token_dtype (nanoGPT's "
                          "train.bin), e.g. the one `python -m examples.tokens` writes")
    if data.name == "loader" and data.root is None and data.size < batch_size:
        raise ConfigError("data.size", data.size, f"at least batch_size ({batch_size}) images: an epoch must hold "
                          "one global batch")


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


def check_plan_nodes(plan: PlanConfig) -> None:
    if plan.nodes and plan.hardware == "local":
        raise ConfigError("plan.nodes", plan.nodes, "0 with plan.hardware=local (this machine is one node); name a "
                          "preset to plan more nodes, e.g. plan.hardware=h100x8 plan.nodes=8")


def check_plan(section: Any) -> PlanConfig:
    """`plan=true|false` or the section, read as from_dict reads it, with its relation."""
    plan = read_value("plan", section, PlanConfig, RUN_FIELDS["plan"])
    check_plan_nodes(plan)
    return plan  # type: ignore[no-any-return]


def check_dist(section: Mapping[str, Any]) -> DistConfig:
    """`dist.*` as from_dict reads it (the collectives benchmark shares it)."""
    return read_record("dist", section, DistConfig)


RUN_FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
