"""results.json as typed records: the one definition its writers fill and its readers read.

A run that did not run (refused, skipped, lost before it started) is the same record with nothing measured
(`RunRecord.not_run`), so readers need no special cases for missing keys. `results.schema.json` beside
this module is generated from these classes (`python -m harness.core.results_schema`) and the test suite
checks every results.json it produces against it. Schema 1 (before these records) still loads: what it
lacks takes the defaults below.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shlex
import socket
import sys
import tempfile
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
Status = Literal["ok", "failed", "oom", "skipped", "interrupted"]
STATUSES: tuple[str, ...] = ("ok", "failed", "oom", "skipped", "interrupted")
RESULTS_NAME = "results.json"
PARAMETERS_NAME = "parameters.pt"  # parity=true: rank 0's trained parameters, beside results.json

# pydantic's config, read when loading and when generating the schema: no key outside these classes; in the
# schema every key is required (a record as written always has them all; schema 1 files load with defaults).
_FORBID = {"extra": "forbid", "json_schema_serialization_defaults_required": True}


@dataclass
class Precision:
    """The amp level as resolved on this machine, and its loss scaling's outcome."""

    __pydantic_config__ = _FORBID
    level: str | None = None
    impl: str | None = None
    dtype: str | None = None
    master_weights: bool | None = None
    keep_batchnorm_fp32: bool | None = None
    loss_scale: float | str | None = None  # a number, or "dynamic"
    final_loss_scale: float | None = None
    skipped_steps: int | None = None


@dataclass
class WindowRecord:
    """One window of `log_every` iterations (harness.core.timing.Window, as written)."""

    __pydantic_config__ = _FORBID
    end_iter: int
    seconds: float
    cumulative_seconds: float
    warmup: bool
    loss: float | None = None
    data_wait_s: float | None = None
    profiled: bool = False


@dataclass
class RankEntry:
    __pydantic_config__ = _FORBID
    rank: int
    local_rank: int | None = None
    pid: int | None = None
    host: str | None = None
    device: str | None = None
    backend: str | None = None
    status: Status | None = None
    error: str | None = None
    allocator: list[dict[str, Any]] | None = None  # torch's allocator peaks per device (GPU runs)
    tensor_peak_mib: float | None = None  # CPU: the peak of live tensor bytes (harness.core.tensor_peak)
    params_held_mib: float | None = None  # the bytes the rank's parameters hold once set up (FSDP2: its shards)


@dataclass
class PredictionRecord:
    """What harness.prediction predicted before the run (on this machine's measured preset): the figures compared,
    and the breakdown (memory per rank by kind, time by part, assumptions) as the planner wrote it."""

    __pydantic_config__ = _FORBID
    hardware: str
    peak_mib: float  # the largest rank's predicted peak
    s_per_iteration: float | None  # None: not predicted (the combination would not fit)
    throughput_img_s: float | None
    fits: bool
    device_memory_mib: float
    world_size: int
    memory: list[dict[str, Any]] = field(default_factory=list)
    time: dict[str, float | None] = field(default_factory=dict)
    flops_per_iteration: int | None = None  # torch's FLOP counter over one traced step, every rank's batch
    misfit: str | None = None
    mfu: float | None = None  # the model's FLOPs per second over every device's peak (harness.prediction.predict)
    peak_tflops: float | None = None  # one device's (CPU: one process's) peak in the run's compute dtype
    peak_source: str = ""
    peak_mib_band: list[float | None] = field(default_factory=list)  # where 90 % of the truths fall
    s_per_iteration_band: list[float | None] = field(default_factory=list)
    throughput_band: list[float | None] = field(default_factory=list)
    band_source: str = ""  # what the band was derived from
    busy: str | None = None  # why the calibration cannot be trusted (the machine was busy), or None
    assumptions: list[str] = field(default_factory=list)
    calibration: dict[str, Any] = field(default_factory=dict)


@dataclass
class PredictionError:
    """(measured - predicted) / measured, each with what was measured."""

    __pydantic_config__ = _FORBID
    peak_mib: float | None = None
    s_per_iteration: float | None = None
    measured_peak_mib: float | None = None
    measured_s_per_iteration: float | None = None
    memory_source: str | None = None  # what measured the peak: the allocator (GPU) or the live-tensor probe (CPU)


@dataclass
class DeviceMemory:
    __pydantic_config__ = _FORBID
    device: str
    peak_mib: float | None = None
    baseline_mib: float | None = None


@dataclass
class ProcessMemory:
    __pydantic_config__ = _FORBID
    pid: int | None
    device: str
    rank: int | None = None
    peak_mib: float | None = None
    role: str = "rank"  # rank, launcher, data (a loader worker), other, or unmatched (see `nvml_pid`)
    host: str = ""
    node: int | None = None  # torchrun across nodes: the node's rank
    # the PID NVML reported, where it is not `pid`: inside a container NVML gives the host's PIDs
    nvml_pid: int | None = None


@dataclass
class Memory:
    __pydantic_config__ = _FORBID
    source: str | None = None  # nvml, psutil, torch-allocator (no sampler), None (nothing measured)
    samples: int | None = None
    per_device: list[DeviceMemory] = field(default_factory=list)
    per_process: list[ProcessMemory] = field(default_factory=list)
    warning: str | None = None


@dataclass
class MemoryTheory:
    """Parameters, gradients, optimizer state and master weights per rank, as counted before the run."""

    __pydantic_config__ = _FORBID
    params_mib: float
    grads_mib: float
    optimizer_state_mib: float
    master_weights_mib: float
    total_mib: float
    world_size: int
    sharded: dict[str, bool]
    whole_bytes: dict[str, int]


@dataclass
class Profile:
    """profile=true: the slowest rank's breakdown of its profiled window, and every rank's."""

    __pydantic_config__ = _FORBID
    run: dict[str, Any] | None
    per_rank: dict[str, dict[str, Any]]
    traces: list[str]
    slowdown: float | None
    note: str | None = None


@dataclass
class Parity:
    """parity=true: what the run trained, for comparison with its reference row and between replicas."""

    __pydantic_config__ = _FORBID
    reference: str
    fingerprint: str
    digests: dict[str, str | None] = field(default_factory=dict)
    replicas_agree: bool | None = None
    differing_ranks: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    batchnorm_layers: int = 0
    batchnorm_groups: int | None = None  # absent before batch-norm was counted (older schema-1 files)
    batchnorm_split: str | None = None
    lossy: str | None = None


@dataclass
class GpuActivity:
    __pydantic_config__ = _FORBID
    per_device: list[dict[str, Any]]
    readings: int
    unavailable: dict[str, str]


@dataclass
class CompileCache:
    __pydantic_config__ = _FORBID
    dir: str
    warm: bool


@dataclass
class Environment:
    """What the run ran on and with: the versions a comparison between two sweeps needs."""

    __pydantic_config__ = _FORBID
    torch: str | None = None
    torch_built_for_cuda: str | None = None
    cuda_available: bool | None = None
    cpu: str | None = None
    cpu_capability: str | None = None
    cpu_native_half: list[str] = field(default_factory=list)
    python: str | None = None
    hostname: str | None = None
    platform: str | None = None
    command: str | None = None
    harness_commit: str | None = None
    driver: str | None = None
    gpu_names: list[str] = field(default_factory=list)
    packages: dict[str, str] = field(default_factory=dict)  # versions of the other packages the run used
    launcher: str | None = None  # "torchrun" when run.py was one of torchrun's workers
    describe_error: str | None = None  # why the driver did not say its version or GPU names


# A run's wall time from the launcher's start to its results, in order (results.json's `phases`): each is
# measured, in seconds; a run in this process (no workers) has no process_start or imports.
PHASES = ("prepare", "process_start", "imports", "process_group", "build", "to_first_iteration", "windows",
          "after_loop", "teardown", "results")


@dataclass
class MachineLoad:
    """How busy the machine was around a run: the CPU time processes outside the run took during its steady
    windows, and the load average just before it started; on GPUs, other PIDs' utilisation (NVML)."""

    __pydantic_config__ = _FORBID
    cores: int | None = None
    load_before: float | None = None  # 1-minute load average when the run started
    others_cpu_s: float | None = None  # CPU seconds of every process not the run's, over the steady windows
    windows_s: float | None = None  # the steady windows' wall time those seconds were taken over
    others_gpu_util_pct: float | None = None  # the largest SM utilisation another PID had on the run's GPUs
    busy: bool = False  # others took at least BUSY_SHARE of the machine during the windows: not judged
    reason: str | None = None  # in words, when busy


@dataclass
class KernelsRecord:
    """What torch had while the run trained (KernelsConfig, read back in rank 0)."""

    __pydantic_config__ = _FORBID
    cudnn_benchmark: bool | None  # None: no CUDA device, where it does not apply
    matmul_precision: str  # torch.get_float32_matmul_precision(): highest = no TF32 for float32 matmuls
    channels_last: bool  # the model's convolution weights (and its image batches) in NHWC

    def words(self) -> str:
        cudnn = "n/a (no CUDA)" if self.cudnn_benchmark is None else "on" if self.cudnn_benchmark else "off"
        return (f"cudnn.benchmark {cudnn}, "
                f"channels_last {'on' if self.channels_last else 'off'}, float32 matmul precision "
                f"{self.matmul_precision}" + (" (no TF32)" if self.matmul_precision == "highest" else ""))


@dataclass
class RunRecord:
    """One combination's results.json."""

    __pydantic_config__ = _FORBID
    schema: int
    status: Status
    strategy: str
    amp: str  # the level asked for (O0-O3); `precision` says what it resolved to
    model: str
    error: str | None = None
    provisional: bool = False  # written before the run started, replaced when it ends
    launcher: str | None = None
    devices: list[str] = field(default_factory=list)
    accelerator: str | None = None
    world_size: int | None = None
    nodes: int = 1
    global_batch: int | None = None
    local_batch: int | None = None
    image_size: int | None = None
    iterations: int | None = None  # run (iterations=auto: as many as it took)
    iterations_requested: int | str | None = None  # a number or "auto"
    stopped_by: str | None = None
    log_every: int | None = None
    warmup_windows: int | None = None
    threads_per_process: int | None = None
    notes: list[str] = field(default_factory=list)
    precision: Precision | None = None
    windows: list[WindowRecord] = field(default_factory=list)
    per_rank_windows: dict[str, list[WindowRecord]] = field(default_factory=dict)
    throughput_img_s: float | None = None  # samples/s: images, or sequences for a token model
    sample: str | None = None  # what one sample is: "images", or "tokens" (a sequence of tokens_per_sample)
    tokens_per_sample: int | None = None
    throughput_tokens_s: float | None = None  # a token model's: throughput_img_s x tokens_per_sample
    # model FLOPs utilisation: the traced step's FLOPs per measured second over the devices' peak (prediction's)
    mfu: float | None = None
    kernels: KernelsRecord | None = None  # cudnn.benchmark, channels_last, float32 matmul precision as run
    data_wait_share: float | None = None
    profile: Profile | None = None
    gpu_activity: GpuActivity | None = None
    energy_j_per_image: float | None = None
    startup_seconds: float | None = None
    command_startup_seconds: float | None = None
    compile_seconds: float | None = None
    compile_cache: CompileCache | None = None
    ranks: list[RankEntry] = field(default_factory=list)
    memory: Memory = field(default_factory=Memory)
    memory_theory: MemoryTheory | None = None
    parity: Parity | None = None
    launcher_pid: int | None = None
    overrides: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # the resolved Hydra config, free-form by design
    strategy_options: dict[str, Any] = field(default_factory=dict)
    variant: str = ""
    compile: bool | None = None
    grad_accum: int | None = None
    env: Environment = field(default_factory=Environment)
    started_at: float | None = None
    finished_at: float | None = None
    round: int | None = None  # which round of a sweep (1, 2, ...): rounds pair runs in the report's ratios
    place: int | None = None  # its place in the round (1: the round's first run): the verdict checks its effect
    after: int | None = None  # the combination (job number) run just before it in the sweep (None: the first)
    phases: dict[str, float] = field(default_factory=dict)  # where the run's wall time went, seconds (PHASES)
    machine: MachineLoad | None = None  # what else the machine did while the run was timed
    prediction: PredictionRecord | None = None  # harness.prediction's, made before the run started
    prediction_error: PredictionError | None = None

    @classmethod
    def not_run(cls, *, status: Status, error: str, strategy: str, amp: str, model: str,
                **known: Any) -> RunRecord:
        """A combination that measured nothing (refused, skipped, its job lost): what its config says, the
        reason, and every measured field empty."""
        return from_dict({"schema": SCHEMA, "status": status, "error": error, "strategy": strategy, "amp": amp,
                          "model": model, **known})

    @property
    def timed(self) -> bool:
        """Finished and measured a throughput."""
        return self.status == "ok" and bool(self.throughput_img_s)

    @property
    def quiet(self) -> bool:
        """Timed while nothing else took the machine: the only runs the verdict judges, in the report's rows and
        in a racing sweep's looks (harness.verdict.rounds, which reads the records the jobs return)."""
        return self.timed and not (self.machine is not None and self.machine.busy)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def checked(self) -> RunRecord:
        """The record as results.json holds it and a reader loads it: every field checked against its type, as
        pydantic reads it (an int where a float is declared becomes a float). A writer that builds the record
        field by field returns this, so what it hands back is what its readers will see."""
        return from_dict(self.to_dict())


# plan.json leaves these out of a row where they are None: a row not predicted has no devices nor prediction
_ABSENT_WHEN_NONE = ("name", "world_size", "prediction", "seconds")


@dataclass(kw_only=True)
class PlanRow:
    """One row of plan.json (`plan=true`, a search on a preset): a combination predicted on a preset, or why not.
    `status`: predicted, skipped or not predicted (a search adds pruned and refused); `reason` says why, or what
    would not fit. Nothing here is measured: the prediction is the one a run's results.json holds."""

    __pydantic_config__ = _FORBID
    name: str | None = None  # a search's candidate, as its progress lines name it
    strategy: str = ""
    amp: str = ""
    model: str = ""
    variant: str = ""
    hardware: str = ""
    global_batch: int | None = None
    status: str
    world_size: int | None = None  # the devices predicted for (predicted rows)
    reason: str | None = None
    prediction: PredictionRecord | None = None
    overrides: list[str] = field(default_factory=list)
    tokens_per_sample: int | None = None  # a token model's sequence: its rates in tokens/s
    unit: str = "img/s"
    seconds: float | None = None  # how long its prediction took

    @property
    def label(self) -> str:
        """`ddp O1 comm_hook=bf16`: how the tables name the row."""
        return " ".join(filter(None, (self.strategy, self.amp, self.variant)))

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not (v is None and k in _ABSENT_WHEN_NONE)}

    @classmethod
    def from_json(cls, data: Any) -> PlanRow:
        """A row as harness.launch.on_preset.predict_on and a search build it, checked like a results.json."""
        return record_of(cls, data, "plan.json")


class SchemaError(ValueError):
    """A results.json this harness cannot read; one line naming the versions."""


def from_dict(data: Any) -> RunRecord:
    """A record from results.json's content, every field checked against its type (pydantic builds the
    dataclasses); schema 1 loads with defaults for what it lacks."""
    if not isinstance(data, dict) or "schema" not in data or "status" not in data:
        raise SchemaError("not a results file (no schema/status)")
    if data["schema"] not in READABLE_SCHEMAS:
        raise SchemaError(f"results.json schema {data['schema']!r} is not one this harness reads "
                          f"({', '.join(map(str, READABLE_SCHEMAS))})")
    return record_of(RunRecord, data)


Record = TypeVar("Record")


def record_of(cls: type[Record], data: Any, where: str = RESULTS_NAME) -> Record:
    """One of results.json's records (a whole RunRecord, or a part such as `Memory`) from the mapping that builds
    it: the feature modules (harness.memory, .profile, .parity) hand their sections over as mappings, and each
    is read into its record here, every field checked against its type as a results.json is when loaded."""
    from pydantic import ValidationError

    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as error:
        first = error.errors()[0]
        at = ".".join(str(p) for p in first["loc"])
        got = "" if first["type"] == "missing" else f" (got {first.get('input')!r:.80})"
        raise SchemaError(f"{where}: {at}: {first['msg']}{got}") from None


def run_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """RunRecord fields from plain values (the ranks' figures, merged by harness.core.rank_record): each read into
    its field's type and checked as results.json is when loaded (a mapping becomes its record)."""
    from pydantic import ValidationError

    types = _run_types()
    unknown = sorted(set(values) - set(types))
    if unknown:
        raise SchemaError(f"{RESULTS_NAME}: no RunRecord field {', '.join(unknown)} (a figure merged from the ranks "
                          "needs one of the same name)")
    fields = {}
    for name, value in values.items():
        try:
            fields[name] = _adapter(types[name]).validate_python(value)
        except ValidationError as error:
            raise SchemaError(f"{RESULTS_NAME}: {name}: {error.errors()[0]['msg']} (got {value!r:.80})") from None
    return fields


@functools.cache
def _run_types() -> dict[str, Any]:
    """RunRecord's field -> its type (the annotations resolved once)."""
    return typing.get_type_hints(RunRecord)


@functools.cache
def _adapter(cls: type) -> Any:
    """pydantic's validator for a record class, built once per process (building it takes milliseconds)."""
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


def write_json_atomic(path: Path, data: Any) -> None:
    """Temp file in the same folder, fsync, rename: a reader sees the old file or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it 0600; results are for others to read too
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, default=str)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(run_dir: Path, results: RunRecord | dict[str, Any]) -> Path:
    """Never over another run's results: a folder holds one run (its own provisional record aside). A dict is
    checked as a record first, so no writer can put a key or a type in results.json that the schema lacks."""
    path = run_dir / RESULTS_NAME
    if path.exists() and not _is_provisional(path):
        raise FileExistsError(f"{path} already holds a run's results; refusing to overwrite it")
    record = results if isinstance(results, RunRecord) else from_dict({"schema": SCHEMA, **results})
    if record.status not in STATUSES:
        raise ValueError(f"status {record.status!r} is not one of {', '.join(STATUSES)}")
    write_json_atomic(path, record.to_dict())
    return path


def write_provisional(run_dir: Path, record: RunRecord, reason: str) -> Path:
    """A `failed` record written before the run starts, replaced when it ends: if the writer is killed
    without a chance to write (NCCL's watchdog aborting rank 0 after a peer died, the OOM killer), the
    run is still on record, failed, with the likely reasons."""
    return write_results(run_dir, replace(record, status="failed", error=reason, provisional=True).checked())


def _is_provisional(path: Path) -> bool:
    try:
        return load_results(path).provisional
    except (OSError, ValueError):
        return False


def load_results(path: Path) -> RunRecord:
    with open(path) as handle:
        data = json.load(handle)
    return from_dict(data)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def harness_commit() -> str | None:
    """The commit the harness runs from (`+changes` when the working tree differs), None outside git."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty else "")


# Besides torch: what a comparison between two sweeps may need to explain a difference (absent: not installed)
PACKAGES = ("torchvision", "numpy", "hydra-core", "nvidia-ml-py", "apex", "horovod", "pytorch-ignite", "torch_xla")


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def environment(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch

    from harness.core.devices import cpu_has_native_half

    env = {
        "torch": torch.__version__,
        "torch_built_for_cuda": torch.version.cuda,  # the wheel's CUDA version, GPU or not
        "cuda_available": torch.cuda.is_available(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # AVX2, AVX512...: which kernels torch runs
        "cpu_native_half": [d for d in ("bfloat16", "float16") if cpu_has_native_half(d) is not False],  # the
        # hardware's: amp.cpu_half (in the config) says what a run took it to have
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "harness_commit": harness_commit(),
        "driver": None,
        "gpu_names": [],
        "packages": package_versions(),
    }
    env.update(extra or {})
    return env
