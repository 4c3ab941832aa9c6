"""A combination's prediction: each rank's peak memory by kind, and one iteration's time by part.

Memory: the traced step (harness.prediction.trace) at the rank's micro-batch, with what the strategy shards divided
by the ranks sharing it, its declared communication buffers (strategies' `traffic`), the batches the data
source keeps on the device, and on CUDA the caching allocator's overhead. Time: on this machine the
calibrated forward, backward and optimizer step (harness.prediction.calibrate); on a GPU preset the step's operators
timed by the GPU model (harness.prediction.gpu_model, fitted to published results); plus each declared collective by
the latency-bandwidth model (harness.prediction.links), hidden under the pass it overlaps with, except its last
piece. Each figure carries a 90 % band and says where it comes from."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.core.amp_levels import AmpSpec
from harness.core.checkpointing import mode_of, split_model_options
from harness.core.config import RunConfig
from harness.core.devices import Placement, cpu_half_kernels
from harness.core.inputs import Inputs, inputs_of
from harness.core.traffic import Buffer, Collective, Traffic, tensor_parallel_share
from harness.prediction import pipeline
from harness.prediction.calibrate import Calibration, calibrate, calibrate_strategy
from harness.prediction.gpu_model import BAND_Z, GpuFactors, load_factors, step_time, straggle
from harness.prediction.hardware import GIB, Preset
from harness.prediction.links import collective_seconds
from harness.prediction.trace import (
    PhasePeak,
    StepTrace,
    hashable,
    hashable_builder,
    on_meta,
    trace_ops,
    trace_step,
)
from strategies.capabilities import ShardedParameters

MIB = 2**20
FORWARD_SHARE = 1 / 3  # of forward + backward: backward computes about twice the forward's FLOPs
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class RankMemory:
    device: str
    params_mib: float  # master copies included
    grads_mib: float
    optimizer_mib: float
    activations_mib: float
    inputs_mib: float
    comm_buffers_mib: float
    allocator_mib: float

    @property
    def peak_mib(self) -> float:
        return (self.params_mib + self.grads_mib + self.optimizer_mib + self.activations_mib + self.inputs_mib +
                self.comm_buffers_mib + self.allocator_mib)

    def as_dict(self) -> dict[str, Any]:
        return {**{k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()},
                "peak_mib": round(self.peak_mib, 2)}


@dataclass(frozen=True)
class Prediction:
    hardware: str
    world_size: int
    ranks: tuple[RankMemory, ...]
    device_memory_mib: float
    shared_memory: bool
    compute_s: float
    optimizer_s: float
    comm_s: float
    exposed_comm_s: float
    flops_per_iteration: int  # the model's FLOPs (MFU's: recomputation not counted), every rank's
    global_batch: int
    assumptions: tuple[str, ...]
    calibration: dict[str, Any] = field(default_factory=dict)
    time_band: tuple[float, float] = (1.0, 1.0)  # multipliers of s_per_iteration: where 90 % of the truths fall
    band_source: str = ""
    busy: str | None = None  # why this machine's calibration cannot be trusted (it was busy), or None
    peak_tflops: float | None = None  # one device's (CPU: one process's) peak in the dtype the run computes in
    peak_source: str = ""  # where that peak comes from: this machine's measured GEMM rate, or a datasheet
    input_batches: int = 1  # the batches each rank's data source keeps on its device (the synthetic pool's)

    @property
    def peak_mib(self) -> float:
        return max(r.peak_mib for r in self.ranks)

    @property
    def overlapped_comm_s(self) -> float:
        return self.comm_s - self.exposed_comm_s

    @property
    def s_per_iteration(self) -> float:
        return self.compute_s + self.optimizer_s + self.exposed_comm_s

    @property
    def throughput_img_s(self) -> float:
        return self.global_batch / self.s_per_iteration if self.s_per_iteration > 0 else math.inf

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: the model's FLOPs per second (no recomputation) over every device's peak in the
        dtype the run computes in (None where no time or no peak is known). Every device: one a rank, or each of
        DataParallel's replicas (`ranks` has one entry a device)."""
        seconds = self.s_per_iteration
        if not self.peak_tflops or not math.isfinite(seconds) or seconds <= 0:
            return None
        return self.flops_per_iteration / seconds / (len(self.ranks) * self.peak_tflops * 1e12)

    @property
    def worst(self) -> RankMemory:
        return max(self.ranks, key=lambda r: r.peak_mib)

    def needed_mib(self) -> float:
        """What must fit in one device's memory (CPU ranks share the RAM: all of them together)."""
        return sum(r.peak_mib for r in self.ranks) if self.shared_memory else self.peak_mib

    @property
    def fits(self) -> bool:
        return self.needed_mib() <= self.device_memory_mib

    def misfit(self) -> str | None:
        """`predicted peak 13.2 GiB > 11.0 GiB on cuda:1 (activations 7.9 GiB)`, or None when it fits."""
        if self.fits:
            return None
        worst = self.worst
        largest = max(("params", worst.params_mib), ("gradients", worst.grads_mib),
                      ("optimizer state", worst.optimizer_mib), ("activations", worst.activations_mib),
                      ("inputs", worst.inputs_mib), ("communication buffers", worst.comm_buffers_mib),
                      key=lambda kv: kv[1])
        where = (f"the RAM the {len(self.ranks)} ranks share" if len(self.ranks) > 1 else "the RAM") \
            if self.shared_memory else worst.device
        said = (f"predicted peak {self.needed_mib() / 1024:.1f} GiB > {self.device_memory_mib / 1024:.1f} GiB on "
                f"{where} ({largest[0]} {largest[1] / 1024:.1f} GiB)")
        one = self.one_batch_mib()
        if one is None:
            return said
        verdict = "would fit" if one <= self.device_memory_mib else "would not fit either"
        return (f"{said}; a training script that keeps one batch on the device instead of the harness's "
                f"{self.input_batches}: {one / 1024:.1f} GiB, {verdict}")

    def one_batch_mib(self) -> float | None:
        """What `needed_mib` would be with one input batch per rank on its device, as a training script's loader
        keeps it (None where the harness keeps one already): the other batches' bytes and their allocator share
        taken off."""
        if self.input_batches <= 1:
            return None
        spare = (self.input_batches - 1) / self.input_batches
        cut = [r.peak_mib - r.inputs_mib * spare * (1 + r.allocator_mib / max(r.peak_mib - r.allocator_mib, 1e-9))
               for r in self.ranks]
        return sum(cut) if self.shared_memory else max(cut)

    def as_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "world_size": self.world_size, "peak_mib": self.peak_mib,
                "s_per_iteration": _finite(self.s_per_iteration), "throughput_img_s": _finite(self.throughput_img_s),
                "fits": self.fits, "device_memory_mib": round(self.device_memory_mib, 1),
                "memory": [r.as_dict() for r in self.ranks],
                "time": {k: _finite(v) for k, v in (("compute_s", self.compute_s), ("optimizer_s", self.optimizer_s),
                                                    ("comm_s", self.comm_s), ("exposed_comm_s", self.exposed_comm_s),
                                                    ("overlapped_comm_s", self.overlapped_comm_s))},
                "flops_per_iteration": self.flops_per_iteration, "misfit": self.misfit(), "mfu": self.mfu,
                "peak_tflops": self.peak_tflops, "peak_source": self.peak_source,
                "peak_mib_band": [self.peak_mib * b for b in memory_band()],
                "s_per_iteration_band": [_finite(self.s_per_iteration * b) for b in self.time_band],
                "throughput_band": [_finite(self.global_batch / (self.s_per_iteration * b)) if self.s_per_iteration
                                    else None for b in reversed(self.time_band)],
                "band_source": self.band_source, "busy": self.busy,
                "assumptions": list(self.assumptions), "calibration": self.calibration}



def inputs_here(cfg: RunConfig) -> Inputs:
    """What one sample is for the run's model (harness.core.inputs)."""
    return inputs_of(cfg.model, cfg.data)

def _finite(value: float) -> float | None:
    """None for a figure not predicted (NaN: the combination would not fit)."""
    return None if math.isnan(value) else value


@dataclass(frozen=True)
class Target:
    """Where the combination is predicted: this machine (calibrated at a rank's thread count) or a preset."""

    preset: Preset
    calibration_threads: int
    link_measured: bool = True  # False: this machine's link was never measured (communication left out)
    link_scale: float = 1.0  # this machine's CPU now, over its speed when the link was measured (hardware.at_speed)

    def link_notes(self, ranks: int) -> tuple[str, ...]:
        """What the predictions say of this machine's link."""
        if ranks <= 1 or not self.link_measured or abs(self.link_scale - 1) < 0.005:
            return ()
        return (f"this machine's CPU runs at {self.link_scale:.2f}x its speed when the link was measured (one "
                "thread's matrix products): the link's latency and bandwidth taken at that speed",)


def predict(cfg: RunConfig, placement: Placement, amp: AmpSpec, strategy_cls: Any, target: Target) -> Prediction:
    preset = target.preset
    traffic: Traffic = strategy_cls.traffic(cfg.strategy)
    if not traffic.predictable:
        raise NotPredictable(traffic.why_not)
    if traffic.microbatches:
        return predict_pipeline(cfg, placement, amp, strategy_cls, target, traffic)
    n = placement.world_size
    replicas = len(placement.gpus) if traffic.replicas_per_device and placement.gpus else 1  # DataParallel's
    tp = traffic.tensor_parallel_over(n)
    local_batch = cfg.batch_size // (n // tp) // replicas  # DataParallel: each replica's share;
    # tensor parallelism: every rank of a TP group on the group's share
    micro = local_batch // cfg.grad_accum
    unit_names = _unit_names(strategy_cls, cfg) if any(b.size.startswith("unit") for b in traffic.buffers) else None
    kernels = half_kernels(amp, preset)
    trace = trace_step(cfg.model, inputs_here(cfg), amp, cfg.optim, micro, cfg.grad_accum, unit_names,
                       aten_convolutions=kernels == "aten", device=preset.accelerator)
    if tp > 1:  # one rank's share of the activations, by the count per block (tensor_parallel_share)
        fewer = functools.partial(trace_step, inputs=inputs_here(cfg), amp=amp, optim=cfg.optim, micro_batch=micro,
                                  grad_accum=cfg.grad_accum, unit_names=unit_names,
                                  aten_convolutions=kernels == "aten", device=preset.accelerator)
        trace = with_activations(trace, tensor_parallel_rank_activations(cfg, traffic, tp, trace, fewer))
    ranks = memory_by_rank(trace, traffic, strategy_cls.shards, n, cfg, placement, preset, replicas)
    device_memory = preset.device_memory_gib * GIB / MIB
    needed = sum(r.peak_mib for r in ranks) if preset.shared_memory else max(r.peak_mib for r in ranks)
    notes: tuple[str, ...]
    if tp > 1 and needed <= device_memory:  # the activations of one rank's slices, where they can be measured here
        measured_acts = tensor_parallel_activations(cfg, amp, target, micro, placement, tp, trace)
        if measured_acts is not None:
            trace = with_activations(trace, measured_acts)
            ranks = memory_by_rank(trace, traffic, strategy_cls.shards, n, cfg, placement, preset, replicas)
            needed = sum(r.peak_mib for r in ranks) if preset.shared_memory else max(r.peak_mib for r in ranks)
    if needed > device_memory:  # it would not run: its time is not calibrated (that could run out of memory here)
        compute = optimizer = comm = exposed = math.nan
        calibration: dict[str, Any] = {}
        notes = ("time not predicted: the combination would not fit",)
    else:
        # FSDP2 over the whole world: timed as one rank of it (its copies around each unit's collectives)
        sharded = n if strategy_cls.shards[0] and tp == 1 and traffic.sharded_over(n) == n else 1
        compute, optimizer, calibration, notes = compute_time(cfg, amp, target, micro, placement, tp, sharded)
        if not calibration.get("one_tensor_parallel_rank"):
            compute, notes = tensor_parallel_compute(compute, notes, tp)
        # each rank steps its share of the parameters (HSDP: of its shard group's), unless timed as one already
        if any(strategy_cls.shards[2:]) and not calibration.get("one_sharded_rank"):
            optimizer /= traffic.sharded_over(n)
        activations = block_activations(cfg, amp, micro, traffic.sequence_parallel) if tp > 1 else None
        comm, exposed = comm_time(traffic, trace, n, preset, compute, cfg.grad_accum, load_factors().overlap,
                                  activations)
        if activations is not None and (activations.vocab_parallel or traffic.sequence_parallel):
            outside = (["the head's input and loss_parallel's 3 all-reduces of a float a token"]
                       if activations.vocab_parallel else []) + \
                (["the final norm's output and the embeddings' gradient gathered"] if traffic.sequence_parallel else [])
            notes += ("tensor parallelism outside the blocks, every micro-batch: " + "; ".join(outside),)
        if activations is not None and traffic.sequence_parallel:
            notes += (f"sequence parallelism: the {len(activations.whole)} parameters its plan leaves whole on every "
                      "rank (the norms') have their gradients all-reduced once a step, one call each",)
    if cfg.compile:
        notes += ("compile=true: predicted as eager (torch.compile's fusions are not modelled)",)
    assumptions = (*notes, *memory_notes(preset, cfg, amp, kernels, trace),
                   f"communication: {', '.join(_describe(c) for c in traffic.collectives) or 'none'}; "
                   f"latency-bandwidth model over {preset.name}'s links" if traffic.collectives else
                   "communication: none")
    if not target.link_measured and n > 1:
        comm = exposed = 0.0
        assumptions += ("this machine's link was never measured (`python run.py plan=true` with as many ranks measures it): "
                        "communication left out",)
    assumptions += target.link_notes(n)
    if preset.accelerator == "cpu" and n > 1:
        assumptions += ("CPU: communication runs on the cores that compute, so it overlaps nothing here",)
    band = tuple(calibration.get("band", (1.0, 1.0)))
    busy = (calibration.get("compute") or {}).get("busy")
    if busy:
        assumptions += (f"calibrated on a busy machine ({busy}): the time may be too long; predict again when it "
                        "is quiet",)
    return Prediction(hardware=preset.name, world_size=n, ranks=ranks,
                      device_memory_mib=device_memory, shared_memory=preset.shared_memory,
                      compute_s=compute, optimizer_s=optimizer, comm_s=comm, exposed_comm_s=exposed,
                      flops_per_iteration=(trace.model_flops or trace.flops) * (n // tp) * replicas, global_batch=cfg.batch_size,
                      assumptions=assumptions, calibration={**calibration, "trace": trace.as_dict()},
                      time_band=(float(band[0]), float(band[1])), band_source=calibration.get("band_source", ""),
                      busy=busy, peak_tflops=preset.peak_tflops.get(amp.dtype),
                      peak_source=f"{preset.name}: " + ("this machine's measured GEMM rate" if preset.name == "local"
                                                         else "the preset's datasheet figure") + f", {amp.dtype}",
                      input_batches=input_batches(cfg))


class NotPredictable(ValueError):
    """A strategy the planner has no model of (it says why)."""


def predict_pipeline(cfg: RunConfig, placement: Placement, amp: AmpSpec, strategy_cls: Any, target: Target,
                     traffic: Traffic) -> Prediction:
    """strategy=pp: each rank's stage as a model of its own (harness.prediction.pipeline): its memory from the
    traces at its block count and one more, its time the slowest rank's microbatches over the schedule's bubble,
    plus the boundaries' sends. FSDP x PP (`Traffic.pipeline_ranks`): world / pipeline_ranks pipelines, each on its
    share of the batch, a stage's parameters, gradients and state sharded over them, gathered whole for its compute
    (one unit a stage) and its gradients reduce-scattered, waited for."""
    preset, world = target.preset, placement.world_size
    n = traffic.pipeline_ranks or world  # a pipeline's ranks; FSDP x PP: world / n pipelines, each stage sharded
    replicas = world // n
    m = traffic.microbatches
    microbatch = cfg.batch_size // replicas // m  # a pipeline trains its share of the batch, in m microbatches
    options = dict(cfg.strategy)
    schedule = str(options.get("schedule", ""))
    try:
        blocks = pipeline.rank_blocks(pipeline.model_layers(cfg), n, traffic.stages_per_rank)
        whole = trace_step(cfg.model, inputs_here(cfg), amp, cfg.optim, microbatch, 1, device=preset.accelerator)

        def traced(k: int) -> StepTrace:
            stage = pipeline.stage_config(cfg, k)
            return trace_step(stage.model, inputs_here(cfg), amp, cfg.optim, microbatch, 1,
                              device=preset.accelerator)

        before = pipeline.before_blocks_share(cfg, inputs_here(cfg))
        boundary = pipeline.boundary_bytes(cfg, amp, microbatch,
                                           inputs_here(cfg).tokens_per_sample or 1)
    except pipeline.NotAPipelineModel as err:
        raise NotPredictable(f"strategy=pp: {err}") from None
    gpipe = traffic.stages_per_rank == 1 and schedule == "gpipe"
    sample = inputs_here(cfg).input_bytes
    # each rank's shard of the batch (its data source's pool) and the gathered global batch the schedule feeds
    inputs = input_batches(cfg) * (cfg.batch_size // world) * sample + cfg.batch_size // replicas * sample
    overhead_share = whole.allocator_overhead if preset.accelerator == "cuda" else 0.0
    labels = _device_labels(placement, preset, world, 1)
    ranks: list[RankMemory] = []
    stages = []
    for r, k in enumerate(blocks):
        held = pipeline.in_flight(m, n, r, gpipe, traffic.stages_per_rank)
        stages.append(pipeline.stage_bytes(traced(k), traced(k + 1), k, r == 0, r == n - 1, held, m, boundary,
                                           before, traffic.stages_per_rank,
                                           pipeline.sends_alive(m, n, r, traffic.stages_per_rank)))
    for rank in range(world):  # rank r: stage r // replicas of pipeline r % replicas (strategies.fsdp's mesh)
        r = rank // replicas
        part = stages[r]
        buffers = pipeline.receive_buffers(boundary, m, r, n, traffic.stages_per_rank)
        if replicas > 1:  # FSDP2 over the pipelines (one unit a stage): its all-gather's output beside the whole
            # parameters it is copied out into, and the whole gradients the microbatches accumulate before the
            # reduce-scatter (the stage's `set_requires_gradient_sync` holds it to the last)
            buffers += 2 * part.params + part.grads
        live = part.params / replicas + part.grads / replicas + part.state / replicas + part.activations + inputs \
            + buffers
        ranks.append(RankMemory(labels[rank], part.params / replicas / MIB, part.grads / replicas / MIB,
                                part.state / replicas / MIB, part.activations / MIB, inputs / MIB, buffers / MIB,
                                overhead_share * live / MIB))
    device_memory = preset.device_memory_gib * GIB / MIB
    needed = sum(r.peak_mib for r in ranks) if preset.shared_memory else max(r.peak_mib for r in ranks)
    notes: tuple[str, ...] = (pipeline.describe(traffic, n, blocks, schedule),)
    calibration: dict[str, Any] = {}
    if needed > device_memory:
        compute = optimizer = comm = exposed = math.nan
        notes += ("time not predicted: the combination would not fit",)
    else:
        slowest = pipeline.stage_config(cfg, max(blocks))
        if preset.measured and cfg.plan.calibration == "strategy" and not traffic.pipeline_ranks:
            # the slowest stage as a model of its own through strategy=pp in a process group of one: its
            # microbatches through the schedule (torch.export's graph of the stage, the chunks and their gradients
            # it keeps), timed as one
            looped = traffic.stages_per_rank > 1
            if looped:  # a rank's stages on one rank would send to itself, which gloo refuses: its blocks as one
                slowest = dataclasses.replace(slowest, strategy={**slowest.strategy, "schedule": "1f1b"})
            cal = calibrate_strategy_default(slowest, placement, amp, microbatch, pipeline_batch=microbatch * m)
            per_micro, optimizer = cal.forward_backward_s / m, cal.optimizer_s
            calibration = {"compute": cal.as_dict(), "through_schedule": True, **_local_band()}
            notes += (f"compute: the slowest stage ({max(blocks)} blocks) measured here as a model of its own "
                      f"through strategy=pp in a process group of one, {m} microbatches of {microbatch} sequences, "
                      f"{cal.threads} thread(s)" + (f"; the rank's {traffic.stages_per_rank} stages timed as one "
                                                    "through 1F1B (its switching between them not in it)"
                                                    if looped else ""),)
        elif preset.measured:  # the stage's bare model here, at a rank's threads (the schedule's own work not in it)
            cal = calibrate_fn_default(slowest, amp, microbatch, target.calibration_threads)
            per_micro, optimizer = cal.forward_backward_s, cal.optimizer_s
            calibration = {"compute": cal.as_dict(), **_local_band()}
            notes += (f"compute: the slowest stage ({max(blocks)} blocks) measured here as a bare model of its own, "
                      f"{microbatch} sequences a microbatch, {target.calibration_threads} thread(s): the schedule's "
                      "own work is not in it",)
        else:
            per_micro, optimizer, calibration, more = gpu_compute_time(slowest, amp, preset, microbatch, n)
            notes += more
        compute = pipeline.step_seconds(per_micro, traffic, n)
        optimizer /= replicas  # each rank steps its shard of the stage
        slowest_stage = max(stages, key=lambda b: b.params)
        gathers = m * (2 if options.get("reshard_after_forward", True) else 1)
        comm = exposed = pipeline.sends_seconds(boundary, preset, traffic, n, per_micro) + pipeline.sharded_stage_seconds(
            slowest_stage.params, slowest_stage.grads, replicas, gathers, preset)
    assumptions = (*notes, *memory_notes(preset, cfg, amp, None, whole),
                   f"communication: each microbatch's boundary activations ({boundary / MIB:.2f} MiB) sent forward "
                   "and their gradient back, one hop each, waited for; the batch's token ids gathered once")
    if not target.link_measured and world > 1:
        comm = exposed = 0.0
        assumptions += ("this machine's link was never measured (`python run.py plan=true` with as many ranks "
                        "measures it): communication left out",)
    assumptions += target.link_notes(world)
    band = tuple(calibration.get("band", (1.0, 1.0)))
    busy = (calibration.get("compute") or {}).get("busy")
    return Prediction(hardware=preset.name, world_size=world, ranks=tuple(ranks), device_memory_mib=device_memory,
                      shared_memory=preset.shared_memory, compute_s=compute, optimizer_s=optimizer, comm_s=comm,
                      exposed_comm_s=exposed, flops_per_iteration=(whole.model_flops or whole.flops) * m,
                      global_batch=cfg.batch_size, assumptions=assumptions,
                      calibration={**calibration, "trace": whole.as_dict()},
                      time_band=(float(band[0]), float(band[1])), band_source=calibration.get("band_source", ""),
                      busy=busy, peak_tflops=preset.peak_tflops.get(amp.dtype),
                      peak_source=f"{preset.name}: " + ("this machine's measured GEMM rate" if preset.name == "local"
                                                         else "the preset's datasheet figure") + f", {amp.dtype}",
                      input_batches=input_batches(cfg))


@dataclass(frozen=True)
class UnitNames:
    """A sharding strategy's units of a model (strategies.capabilities.ShardedParameters.unit_names), equal for
    equal strategies and options: the traces that take it are cached across combinations and predictions."""

    strategy_cls: Any
    options: tuple[tuple[str, Any], ...]

    def __call__(self, model: Any) -> list[str]:
        options = {k: list(v) if isinstance(v, tuple) else v for k, v in self.options}
        return self.strategy_cls(**options).unit_names(model)


def _unit_names(strategy_cls: Any, cfg: RunConfig) -> Callable[[Any], list[str]] | None:
    """A sharding strategy's units (strategies.capabilities.ShardedParameters); None for any other."""
    if not issubclass(strategy_cls, ShardedParameters):
        return None
    names = UnitNames(strategy_cls, tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                                 for k, v in cfg.strategy.items() if k != "_target_")))
    try:
        hash(names)
    except TypeError:  # an option holding a mapping: traced afresh each time, as any unhashable key would be
        options = {k: v for k, v in cfg.strategy.items() if k != "_target_"}
        return strategy_cls(**options).unit_names  # type: ignore[no-any-return]
    return names


def memory_by_rank(trace: StepTrace, traffic: Traffic, shards: tuple[bool, bool, bool], n: int, cfg: RunConfig,
                   placement: Placement, preset: Preset, replicas: int) -> tuple[RankMemory, ...]:
    """Each rank's memory at the larger of its two peaks: forward and backward's (the activations), and the
    optimizer step's (every gradient alive, and the step's own temporaries, which a sharded optimizer makes for
    its shard only). What is sharded is divided by the ranks one copy of it is spread over (`Traffic.sharded_over`:
    the world, or HSDP's shard group)."""
    params_sharded, grads_sharded, state_sharded = shards
    over = traffic.sharded_over(n)
    # one shard a copy: FSDP's all-gather of its only shard is the shard itself (no gathered units); its gradients
    # still pass through a reduce-scatter buffer
    buffers = sum(_buffer_bytes(b, trace) for b in traffic.buffers if over > 1 or b.size != "unit_params")
    sample = inputs_here(cfg).input_bytes  # fp32 pixels and an int64 label, or token ids and their next ones
    local_batch = cfg.batch_size // (n // traffic.tensor_parallel_over(n))  # a TP group's ranks read its share
    inputs = input_batches(cfg) * local_batch * sample
    overhead = trace.allocator_overhead if preset.accelerator == "cuda" else 0.0
    grads_kept = trace.model_grads / over if grads_sharded else trace.model_grads

    def phase(peak: PhasePeak, stepping: bool) -> tuple[float, float, float, float]:
        """params, grads, state, activations of one phase's peak, as this strategy holds them."""
        params = trace.stored_params / over if params_sharded else peak.params + peak.masters
        if stepping:
            grads = grads_kept
        elif cfg.grad_accum > 1:  # later micro-batches run with the earlier ones' gradients kept
            grads = max(peak.grads / over if grads_sharded else peak.grads, grads_kept)
        else:
            grads = peak.grads / over if grads_sharded else peak.grads
        state = peak.optimizer_state / over if state_sharded else peak.optimizer_state
        acts = peak.activations / over if stepping and state_sharded else peak.activations
        return params, grads, state, acts

    phases = trace.phases or (PhasePeak(trace.peak, trace.params, trace.masters, trace.grads, trace.optimizer_state,
                                        trace.activations),)
    params, grads, state, acts = max((phase(p, i == 1) for i, p in enumerate(phases)), key=sum)

    def rank(device: str, params: float, grads: float, state: float, acts: float, inputs: float,
             buffers: float) -> RankMemory:
        live = params + grads + state + acts + inputs + buffers
        return RankMemory(device, params / MIB, grads / MIB, state / MIB, acts / MIB, inputs / MIB, buffers / MIB,
                          overhead * live / MIB)

    labels = _device_labels(placement, preset, n, replicas)
    if replicas > 1:  # DataParallel: the base device keeps everything, each other a replica and its activations
        first = rank(labels[0], params, grads, state, acts, inputs, buffers)
        others = [rank(label, trace.params, trace.grads, 0, trace.activations, 0, 0) for label in labels[1:]]
        return (first, *others)
    return tuple(rank(label, params, grads, state, acts, inputs, buffers) for label in labels)


def _device_labels(placement: Placement, preset: Preset, n: int, replicas: int) -> list[str]:
    count = max(n, replicas)
    if preset.accelerator == "cuda":
        return [f"cuda:{i}" if preset.nodes == 1 else f"node{i // preset.devices_per_node}/cuda:"
                f"{i % preset.devices_per_node}" for i in range(count)]
    return [f"cpu:{i}" if count > 1 else "cpu" for i in range(count)]


def _buffer_bytes(buffer: Buffer, trace: StepTrace) -> float:
    grad_element = trace.model_grads / max(trace.param_count, 1)
    ratio = ELEMENT_BYTES[buffer.dtype] / grad_element if buffer.dtype else 1.0
    if buffer.size == "grads":
        size = trace.model_grads * ratio
    elif buffer.size == "params":
        size = trace.model_params
    elif buffer.size == "bucket":
        size = min(buffer.bucket_cap_mb * MIB, trace.model_grads) * ratio
    else:  # unit_params / unit_grads: the largest unit, as cast
        size = max(trace.units, default=0)
    return size * buffer.copies


def half_kernels(amp: AmpSpec, preset: Preset) -> str | None:
    """On a CPU, which kernels a half level's convolutions take (`onednn`, or ATen's reference kernels, `aten`,
    on a CPU without native ones or taken as such by amp.cpu_half); None where nothing computes in half on a
    CPU."""
    if preset.accelerator != "cpu" or not (amp.autocast or amp.cast_model):
        return None
    return cpu_half_kernels(amp.dtype, amp.cpu_half)


def input_batches(cfg: RunConfig) -> int:
    """The input batches a rank keeps on its device: the synthetic pool's (data.pool), or a loader's batch in use
    and the next."""
    return cfg.data.pool if cfg.data.name == "synthetic" else 2


def memory_notes(preset: Preset, cfg: RunConfig, amp: AmpSpec, kernels: str | None, trace: StepTrace,
                 ) -> tuple[str, ...]:
    notes = ["memory: a step traced by torch's MemTracker on meta/fake tensors (two steps: the second's peak)",
             f"inputs: {input_batches(cfg)} batches kept on the device"
             + (" (data.pool: the harness's synthetic batches; a training script's loader keeps one or two)"
                if cfg.data.name == "synthetic" and input_batches(cfg) > 2 else "")]
    if kernels == "aten":
        notes.append(f"memory: {amp.dtype} convolutions on ATen's reference kernels (no native {amp.dtype} "
                     f"kernels on this CPU{', as amp.cpu_half=emulated takes it' if amp.cpu_half == 'emulated' else ''}):"
                     " their column buffers counted, up to kernel area x the input for one convolution at a time")
    elif kernels == "onednn":
        notes.append(f"memory: {amp.dtype} convolutions on oneDNN's native kernels (their scratch space is outside "
                     "torch's allocator and not counted)")
    if preset.accelerator == "cuda":
        notes.append(f"allocator: {trace.allocator_overhead:.1%} of the live peak beyond it, torch's CUDA caching "
                     "allocator's rules (512-byte rounding, 2 and 20 MiB segments, best fit, splits, cached blocks) "
                     "replayed on the traced step's allocations, cached segments handed back at the device's limit as "
                     f"it does before it reports out of memory; on a GPU with room it would reserve "
                     f"{trace.reserved_overhead:.1%} beyond (max_memory_reserved); the CUDA context is outside the "
                     "allocator and not counted")
    else:
        notes.append("CPU: peak of live tensor bytes (no caching allocator)")
    return tuple(notes)


def compute_time(cfg: RunConfig, amp: AmpSpec, target: Target, micro: int, placement: Placement | None = None,
                 tensor_parallel: int = 1, sharded: int = 1) -> tuple[float, float, dict[str, Any], tuple[str, ...]]:
    """One rank's forward and backward, and optimizer step. `tensor_parallel` > 1: here, one rank of such a group
    is measured on its own slices (the calibration says `one_tensor_parallel_rank`); elsewhere the whole model's.
    `sharded` > 1: here, one rank of FSDP2 over that many, its optimizer on its shard (`one_sharded_rank`)."""
    preset = target.preset
    if preset.measured and placement is not None and cfg.plan.calibration == "strategy":
        cal = calibrate_strategy_default(cfg, placement, amp, micro, tensor_parallel, data_parallel=sharded)
        group = (f"as one rank of a tensor-parallel group of {tensor_parallel} (a fake process group: its slices of "
                 "the weights, their collectives left to the collectives model)" if tensor_parallel > 1
                 else f"as one rank of {sharded} (a fake process group: the copies around each unit's gather and "
                 "reduce-scatter, the optimizer on its shard; the collectives left to the collectives model)"
                 if sharded > 1 else "in a process group of one")
        return cal.forward_backward_s, cal.optimizer_s, {"compute": cal.as_dict(), **_local_band(),
                                                         "one_tensor_parallel_rank": tensor_parallel > 1,
                                                         "one_sharded_rank": sharded > 1}, (
            f"compute: measured here through strategy={cfg.strategy_name} {group}, {micro} images "
            f"per micro-batch, {cal.threads} thread(s) (its wrapper and hooks included; what crosses a link is the "
            "collectives model's)",)
    if preset.measured:  # plan.calibration=model: the bare model, in this process
        cal = calibrate_fn_default(cfg, amp, micro, target.calibration_threads)
        return cal.forward_backward_s, cal.optimizer_s, {"compute": cal.as_dict(), **_local_band()}, (
            f"compute: measured here on the bare model (plan.calibration=model), {micro} images per micro-batch, "
            f"{target.calibration_threads} thread(s): the strategy's wrapper and hooks are not in it",)
    return gpu_compute_time(cfg, amp, preset, micro, placement.world_size if placement else 1)


# RMS of log(measured / predicted) time over benchmark 13's 28 cases (bench/prediction.py, 2026-11-25, a 2-core AMD
# EPYC VM): this machine's predictions are as right as that, on a quiet machine
LOCAL_LOG_SD = 0.23
# RMS of log(measured / predicted) peak memory over the same 28 cases: no GPU has checked the memory model yet, so
# presets take this band too
MEMORY_LOG_SD = 0.063


def memory_band() -> tuple[float, float]:
    return math.exp(-BAND_Z * MEMORY_LOG_SD), math.exp(BAND_Z * MEMORY_LOG_SD)



def _local_band() -> dict[str, Any]:
    """This machine: the spread of benchmark 13's time errors around the calibrated step."""
    return {"band": [math.exp(-BAND_Z * LOCAL_LOG_SD), math.exp(BAND_Z * LOCAL_LOG_SD)],
            "band_source": f"benchmark 13's time errors on this kind of machine (RMS of log errors {LOCAL_LOG_SD})"}


def gpu_compute_time(cfg: RunConfig, amp: AmpSpec, preset: Preset, micro: int, ranks: int,
                     factors: GpuFactors | None = None) -> tuple[float, float, dict[str, Any], tuple[str, ...]]:
    """A preset's compute from the step's operators (harness.prediction.gpu_model): nothing is timed here, so this
    machine's load cannot move it. `factors`: the shipped ones unless given (a fit tries others)."""
    ops = trace_ops(cfg.model, inputs_here(cfg), amp, cfg.optim, micro, cfg.grad_accum)
    factors = factors or load_factors()
    # the kernel settings the run would have there (on a GPU preset, the GPU defaults: channels_last)
    tf32_matmul = cfg.kernels.matmul_precision != "highest"
    time = step_time(ops, preset.peak_tflops, preset.memory_gbps, factors, tf32_matmul=tf32_matmul,
                     channels_last=cfg.kernels.channels_last, kernel_share=preset.kernel_share)
    wait = straggle(ranks, factors)
    low, high = factors.band()
    notes = (f"compute: each of the step's {time.kernels} kernels at its roofline time on {preset.name} (FLOPs at "
             f"the peak of its dtype, bytes at {preset.memory_gbps:g} GB/s, each times a fraction fitted to "
             f"{factors.cases} published training results) plus {factors.launch_us:.1f} us per launch; TF32 for "
             f"float32 convolutions, {'and' if tf32_matmul else 'not'} for float32 matmuls "
             f"(kernels.matmul_precision={cfg.kernels.matmul_precision}); images "
             f"{'channels_last' if cfg.kernels.channels_last else 'NCHW'} (kernels.channels_last)",
             f"time band x{low:.2f}-x{high:.2f}: 90 % of the errors on published results whose architecture family "
             "or GPU the fit had not seen (harness/prediction/published.csv, benchmark 14)")
    if ranks > 1:
        notes += (f"{ranks} ranks wait for the slowest each step: x{wait:.3f} (rank-to-rank variation "
                  f"{factors.sync_cv:.1%}, fitted)",)
    return time.forward_backward_s * wait, time.optimizer_s, {
        "gpu_model": {**time.as_dict(), "straggle": wait, "factors": factors.as_dict()}, "band": [low, high],
        "band_source": "the GPU model's errors on published training results of architecture families and GPU "
                       "types held out of its fit"}, notes


def calibrate_strategy_default(cfg: RunConfig, placement: Placement, amp: AmpSpec, micro: int,
                               tensor_parallel: int = 1, pipeline_batch: int = 0,
                               data_parallel: int = 1) -> Calibration:
    return calibrate_strategy(cfg, placement, amp, micro, tensor_parallel, pipeline_batch, data_parallel)


def calibrate_fn_default(cfg: RunConfig, amp: AmpSpec, micro: int, threads: int) -> Calibration:
    """On this machine's own accelerator: its GPU where it has one (a child process), else its CPU."""
    import torch

    return calibrate(cfg.model, inputs_here(cfg), amp, cfg.optim, micro, cfg.grad_accum, threads, "cuda" if torch.cuda.is_available() else "cpu")


def comm_time(traffic: Traffic, trace: StepTrace, n: int, preset: Preset, compute: float, micro_batches: int = 1,
              overlap: float = 1.0, activations: BlockActivations | None = None) -> tuple[float, float]:
    """Seconds of communication per iteration, and the part not hidden under the pass it overlaps with: what runs
    under compute (`compute`: the iteration's, every micro-batch) is hidden at the share `overlap` (a GPU factor
    fitted to the published language-model runs, as a whole: why they hide less, whether NCCL's kernels sharing the
    SMs and memory bandwidth or gaps in a framework's prefetching, is not modelled apart), the rest waited for. A collective `every` micro-batch runs `micro_batches` times. Each
    collective runs over its group (`Collective.group`): the world; or with HSDP's replicas (`Traffic.replicate`)
    one shard group, world/replicate consecutive ranks (rank i on node i // devices_per_node, as the planner labels
    devices), or the replicate group, one rank of each shard group (across nodes once shard groups fill them),
    which exchanges 1/shard of the payload: the shard its group reduced; a group with fewer ranks a node than the
    node has devices crosses nodes through its share of the node's link (links.node_share). Tensor parallelism
    (`Traffic.tensor_parallel` > 1): `tp` is a group of that many consecutive ranks, `dp` one rank of each, exchanging its TP slice of the
    parameters (1/tp of the payload); an `activations` collective is `count` calls a block of `activations`' size.
    Where the link measured what a call adds right after compute (this machine's: Link.added_after), each call that
    follows compute pays it at the step's compute shared among them: each of TP's and each of FSDP's units' calls,
    each bucket issued under backward; a call waited for after the step's compute, or of a run of calls back to back
    (one a parameter, the whole parameters' in the step) the first."""
    if n <= 1 or not traffic.collectives:
        return 0.0, 0.0
    nodes = preset.nodes if preset.devices >= n else max(1, math.ceil(n / preset.devices_per_node))
    per_node = min(n, preset.devices_per_node)
    shard = traffic.sharded_over(n)

    def layout(group: str) -> tuple[int, int]:
        """(ranks a node, nodes) of one group of `group`: the world's as before; a smaller group's from its ranks."""
        ranks = tensor_parallel_ranks(group, n, traffic.tensor_parallel_over(n)) or (
            range(n) if group == "world" else range(shard) if group == "shard" else range(0, n, shard))
        if len(ranks) == n:
            return per_node, nodes
        on_node = Counter(r // preset.devices_per_node for r in ranks)
        return max(on_node.values()), len(on_node)

    hidden_budget = {"forward": compute * FORWARD_SHARE, "backward": compute * (1 - FORWARD_SHARE), "none": 0.0}
    if preset.accelerator == "cpu":
        hidden_budget = {k: 0.0 for k in hidden_budget}
    total = exposed = 0.0
    tp_group = ""  # the tensor-parallel collectives' group, where there are some
    unit_calls = bool(trace.units) and any(b.size.startswith("unit") for b in traffic.buffers)
    following: list[tuple[str, float, str, tuple[int, int], float]] = []  # calls after compute: (op, bytes, dtype,
    # their group's layout, how many a step)
    for collective in traffic.collectives:
        times = micro_batches if collective.every == "micro_batch" else 1
        if collective.payload in ("activations", "whole_grads"):  # tensor parallelism: on the critical path
            tp_calls, tp_dtype = activation_calls(collective, activations, trace.grad_dtype)
            group_per_node, group_nodes = layout(collective.group)
            seconds = sum(collective_seconds(collective.op, c, group_per_node, group_nodes, preset.intra, preset.inter,
                                             preset.per_op, tp_dtype, preset.devices_per_node)
                          for c in tp_calls) * times
            total += seconds
            exposed += seconds
            tp_group = collective.group
            if tp_calls:  # each activation call follows compute; the whole parameters' run back to back: once
                following.append((collective.op, tp_calls[0], tp_dtype, (group_per_node, group_nodes),
                                  (len(tp_calls) if collective.payload == "activations" else 1) * times))
            continue
        size = _payload_bytes(collective, trace)
        if collective.group == "dp":  # FSDP x TP: each rank's TP slice of the parameters
            size /= traffic.tensor_parallel_over(n)
        if collective.group == "replicate":  # the shard its shard group reduced, one rank of each group
            size /= shard
        group_per_node, group_nodes = layout(collective.group)
        if unit_calls:  # FSDP: one call per unit (each pays the latency), the root's parameters in one more
            share = size / max(trace.model_params if collective.payload == "params" else trace.model_grads, 1)
            calls = [u * share for u in trace.units] + [max(0.0, size - sum(trace.units) * share)]
        elif collective.calls == "per_param":  # one call per parameter: each pays the latency
            calls = [size * rows * cols / max(trace.param_count, 1) for rows, cols in trace.matrices]
        else:
            calls = [size]
        dtype = collective.dtype or ("float32" if collective.payload == "stored_params" and trace.masters else
                                     trace.param_dtype if collective.payload in ("params", "stored_params") else
                                     trace.grad_dtype)
        seconds = sum(collective_seconds(collective.op, c, group_per_node, group_nodes, preset.intra, preset.inter,
                                         preset.per_op, dtype, preset.devices_per_node) for c in calls if c > 0)
        seconds *= times
        pieces = len(calls) if unit_calls or collective.calls == "per_param" else max(1, math.ceil(size / (25 * MIB)))
        if size > 0 and collective.group != "replicate":  # HSDP's replicas reduce right after the shard group
            # each unit's call and each bucket issued under a pass follow compute; a waited-for call, or run of
            # calls back to back (one a parameter: ZeRO's broadcasts, the all-reduce by hand), follows the step's
            # compute once
            one = not unit_calls and collective.overlap == "none"
            following.append((collective.op, size / pieces, dtype, (group_per_node, group_nodes),
                              (1 if one else pieces) * times))
        last = seconds / pieces  # the last bucket (or the first unit, each micro-batch's) waits for its pass
        covered = min(seconds - last, hidden_budget[collective.overlap])
        hidden_budget[collective.overlap] -= covered
        hidden = covered * overlap
        total += seconds
        exposed += seconds - hidden
    if tp_group and activations is not None:  # outside the blocks: on the critical path, as the blocks' are
        group_per_node, group_nodes = layout(tp_group)
        seconds = sum(collective_seconds(op, size, group_per_node, group_nodes, preset.intra, preset.inter,
                                         preset.per_op, dtype, preset.devices_per_node)
                      for op, size, dtype in outside_blocks_calls(activations, traffic.sequence_parallel))
        total += seconds * micro_batches
        exposed += seconds * micro_batches
        following += [(op, size, dtype, (group_per_node, group_nodes), micro_batches)
                      for op, size, dtype in outside_blocks_calls(activations, traffic.sequence_parallel)]
    after = sum(count for *_, count in following)
    if after and compute > 0:  # each call after its share of the step's compute
        added = sum(count * (collective_seconds(op, size, *layout_of, preset.intra, preset.inter, preset.per_op, dtype,
                                                preset.devices_per_node, after_s=compute / after) -
                             collective_seconds(op, size, *layout_of, preset.intra, preset.inter, preset.per_op, dtype,
                                                preset.devices_per_node))
                    for op, size, dtype, layout_of, count in following)
        total += added
        exposed += added
    return total, exposed


def _payload_bytes(collective: Collective, trace: StepTrace) -> float:
    grad_element = trace.model_grads / max(trace.param_count, 1)
    if collective.payload == "params":
        return trace.model_params
    if collective.payload == "stored_params":
        return trace.stored_params
    if collective.payload == "powersgd":
        r = collective.powersgd_rank
        return sum(min(r * (rows + cols) * 4, rows * cols * grad_element) for rows, cols in trace.matrices)
    size = trace.model_grads
    return size * ELEMENT_BYTES[collective.dtype] / grad_element if collective.dtype else size


def _describe(collective: Collective) -> str:
    hidden = {"backward": "under backward", "forward": "under forward", "none": "waited for"}[collective.overlap]
    dtype = f" in {collective.dtype}" if collective.dtype else ""
    group = {"world": "", "shard": ", within each shard group", "replicate": ", across the replicas",
             "tp": ", within each tensor-parallel group", "dp": ", across the tensor-parallel groups"}[collective.group]
    every = ", every micro-batch" if collective.every == "micro_batch" else ""
    every += f", {collective.count} a block" if collective.calls == "per_block" else ""
    every += ", one call a parameter" if collective.calls == "per_param" else ""
    every += f" and {collective.recomputed} more when checkpointed" if collective.recomputed else ""
    return f"{collective.op} of {collective.payload}{dtype} ({hidden}{group}{every})"


# ---- tensor parallelism (strategy=tp, strategy=fsdp strategy.tp=N) ----

@dataclass(frozen=True)
class BlockActivations:
    """One transformer block's activations in one micro-batch, what a TP collective carries: bytes, and the blocks;
    whether the blocks are checkpointed (their forward's collectives partly run again) and the head split by
    vocabulary (loss_parallel's reductions), with the micro-batch's tokens those carry one float each."""

    bytes: float
    blocks: int
    dtype: str
    recomputing: bool = False
    vocab_parallel: bool = False
    tokens: int = 0
    whole: tuple[int, ...] = ()  # sequence parallelism: the elements of each parameter its plan leaves whole
    residual_dtype: str = ""  # the residual stream's (the model's own: float32 under autocast); "": `dtype`

    def of(self, residual: bool) -> tuple[float, str]:
        """A call's bytes and dtype: the projections' (`dtype`), or the residual stream's (Collective.residual)."""
        dtype = (self.residual_dtype or self.dtype) if residual else self.dtype
        return self.bytes / ELEMENT_BYTES[self.dtype] * ELEMENT_BYTES[dtype], dtype


# torch's loss_parallel (torch/distributed/tensor/parallel/loss.py): in forward an all-reduce of each token's
# largest logit and one of its sum of exponentials (`_log_softmax`), one of its target's logit (`_nll_loss_forward`),
# one float32 a token each; its backward is local
LOSS_PARALLEL_REDUCTIONS = 3


def outside_blocks_calls(activations: BlockActivations, sequence_parallel: bool) -> list[tuple[str, float, str]]:
    """What tensor parallelism sends each micro-batch outside the blocks, (op, bytes, dtype), as DTensor issues it
    (counted by CommDebugMode in tests/test_tp.py): where the sequence is split, the final norm's output gathered for
    the head and the embeddings' output gradient gathered in backward; a head split by vocabulary adds its input's
    gradient's reduction (a reduce-scatter onto the sequence's shards, else an all-reduce) and loss_parallel's."""
    size, dtype = activations.of(residual=True)  # the final norm's output, the embeddings' and the head's
    calls = [("all_gather", size, dtype)] * 2 if sequence_parallel else []  # input's gradients
    if activations.vocab_parallel:
        calls += [("reduce_scatter" if sequence_parallel else "all_reduce", size, dtype)]
        calls += [("all_reduce", activations.tokens * 4.0, "float32")] * LOSS_PARALLEL_REDUCTIONS
    return calls


def block_activations(cfg: RunConfig, amp: AmpSpec, micro: int,
                      sequence_parallel: bool = False) -> BlockActivations | None:
    """micro-batch x sequence x width, in the forward's dtype (the amp level's half type from O1 on: autocast's
    projections end in it; the residual stream's calls in the model's own, float32 unless the level casts the model:
    Collective.residual), from the model's own `tp_activations(options)` (width, blocks), given the options its
    factory takes (not the harness's `checkpoint`); None for a model that declares none (activation_calls says
    what to add). With `sequence_parallel`, the parameters its plan leaves whole (`whole_parameters`)."""
    from hydra.utils import get_object

    model = get_object(str(cfg.model["_target_"]))
    declared = getattr(model, "tp_activations", None)
    if not callable(declared):
        return None
    own, _ = split_model_options(cfg.model)
    options = {k: v for k, v in own.items() if not k.startswith("_")}
    width, blocks = declared(options)
    dtype = "float32" if amp.level == "O0" else amp.dtype
    tokens = micro * (inputs_here(cfg).tokens_per_sample or 1)
    sizes = getattr(model, "tp_sizes", None)
    return BlockActivations(float(tokens * width * ELEMENT_BYTES[dtype]), int(blocks), dtype,
                            recomputing=mode_of("model.checkpoint", cfg.model.get("checkpoint", "none")) != "none",
                            vocab_parallel=callable(sizes) and "model.vocab_size" in sizes(options, False),
                            tokens=int(tokens), whole=whole_parameters(cfg) if sequence_parallel else (),
                            residual_dtype=amp.model_dtype)


def whole_parameters(cfg: RunConfig) -> tuple[int, ...]:
    """The elements of each parameter the model's sequence-parallel plan (`tp_plan(True)`) leaves whole on every
    rank: those of the modules it gives torch's SequenceParallel (the norms), which replicates them while their
    inputs are split along the sequence, so that each gradient is a partial sum DTensor all-reduces (counted by
    CommDebugMode in tests/test_tp.py: in the optimizer's step, or under FSDP x TP in FSDP's reduction). The
    model is built on the meta device; its names are matched atom by atom, as parallelize_module matches them."""
    return _whole_parameters(hashable(cfg.model), inputs_here(cfg))


@functools.lru_cache(maxsize=32)
def _whole_parameters(model_cfg: tuple[tuple[str, Any], ...], inputs: Inputs) -> tuple[int, ...]:
    from torch.distributed.tensor.parallel import SequenceParallel

    model = on_meta(hashable_builder(model_cfg, inputs))
    patterns = [name.split(".") for name, style in model.tp_plan(True).items() if isinstance(style, SequenceParallel)]
    whole: dict[str, int] = {}
    for name, module in model.named_modules():
        atoms = name.split(".")
        if any(len(p) == len(atoms) and all(map(fnmatch.fnmatchcase, atoms, p)) for p in patterns):
            whole.update((f"{name}.{key}", param.numel()) for key, param in module.named_parameters())
    return tuple(whole.values())


def activation_calls(collective: Collective, activations: BlockActivations | None,
                     grad_dtype: str = "float32") -> tuple[list[float], str]:
    """Each call's bytes (`count` a block, every block, and `recomputed` more where the blocks are checkpointed) and
    their dtype; for `whole_grads`, one call a whole parameter's gradient, in `grad_dtype`."""
    if activations is None:
        raise NotPredictable("tensor parallelism: the model does not say its blocks' activations (tp_activations)")
    if collective.payload == "whole_grads":
        return [float(n * ELEMENT_BYTES[grad_dtype]) for n in activations.whole], grad_dtype
    per_block = collective.count + (collective.recomputed if activations.recomputing else 0)
    size, dtype = activations.of(collective.residual)
    return [size] * (per_block * activations.blocks), dtype


def tensor_parallel_ranks(group: str, n: int, tp: int) -> range | None:
    """A TP group (tp consecutive ranks) or a data-parallel group across them (one rank of each); None otherwise."""
    if group == "tp":
        return range(tp)
    if group == "dp":
        return range(0, n, tp)
    return None


def passing_activations(trace: StepTrace) -> int:
    """The activations at forward and backward's peak (the step's other phase is the optimizer's)."""
    return trace.phases[0].activations if trace.phases else trace.activations


def tensor_parallel_rank_activations(cfg: RunConfig, traffic: Traffic, tp: int, trace: StepTrace,
                                     trace_at: Callable[..., StepTrace]) -> float:
    """One rank's activations under tensor parallelism of degree `tp`, from the whole model's trace: the blocks'
    (what one more block adds, `trace_at` tracing the model's section with one block fewer) by
    harness.core.traffic.tensor_parallel_share, the rest (embeddings, logits, loss) split by vocabulary (1/tp) where
    the model's head is (its `tp_sizes` name `model.vocab_size`), else, and under full checkpointing (whose rest
    holds the block being recomputed), by the uncheckpointed share. A model without a `layers` option: the share on
    the whole. Against one rank's peak measured in a fake process group of 2 (tests/test_prediction_predict.py)."""
    from hydra.utils import get_class

    sequence = traffic.sequence_parallel
    checkpoint = mode_of("model.checkpoint", cfg.model.get("checkpoint", "none"))
    share = tensor_parallel_share(tp, sequence, checkpoint)
    passing = passing_activations(trace)
    layers = cfg.model.get("layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 2:
        return passing * share
    block = max(0, passing - passing_activations(trace_at({**dict(cfg.model), "layers": layers - 1})))
    rest = max(0, passing - layers * block)
    own, _ = split_model_options(cfg.model)
    sizes = getattr(get_class(str(cfg.model["_target_"])), "tp_sizes", None)
    split = callable(sizes) and "model.vocab_size" in sizes({k: v for k, v in own.items() if not k.startswith("_")},
                                                             sequence)
    outside = 1 / tp if split and checkpoint != "full" else tensor_parallel_share(tp, sequence, "none")
    return layers * block * share + rest * outside


def with_activations(trace: StepTrace, activations: float) -> StepTrace:
    """The trace with its forward-backward phase's activations replaced (a tensor-parallel rank's share)."""
    return dataclasses.replace(trace, activations=activations, phases=tuple(
        dataclasses.replace(phase, activations=activations) if i == 0 else phase for i, phase in enumerate(trace.phases)))


def tensor_parallel_activations(cfg: RunConfig, amp: AmpSpec, target: Target, micro: int, placement: Placement,
                                tp: int, trace: StepTrace) -> float | None:
    """This machine: one TP rank's forward and backward measured in the calibration (a fake process group of the
    group's size, harness.prediction.calibrate), its activations the peak less its share of the gradients alive at
    the pass's peak (the trace's, as memory_by_rank adds them back: with checkpointing the peak comes early in the
    backward, few gradients made; all of them counted put the plan 0.4 MiB under on model=gpt); the batch was made
    before the probe started. None elsewhere (the share of the whole model's by count stands:
    tensor_parallel_share)."""
    if not (target.preset.measured and cfg.plan.calibration == "strategy"):
        return None
    cal = calibrate_strategy_default(cfg, placement, amp, micro, tp)
    peak = getattr(cal, "pass_peak_bytes", None)
    if peak is None:
        return None
    grads = trace.phases[0].grads if trace.phases else trace.grads
    return float(max(0.0, peak - grads / tp))


def tensor_parallel_compute(compute: float, notes: tuple[str, ...], tp: int) -> tuple[float, tuple[str, ...]]:
    """The step as measured or modelled for the whole model, split over the TP group: each rank computes 1/tp of it
    (the embeddings, norms and head, computed whole on every rank, are counted split too: a lower bound)."""
    if tp <= 1:
        return compute, notes
    return compute / tp, (*notes, f"tensor parallelism: each of the {tp} ranks of a group computes 1/{tp} of the "
                          "model's step on the group's batch (the parts it keeps whole counted split too); its "
                          "activations the share a rank holds by the count per block (Korthikanti et al. 2022)")
