"""This machine's measured compute for one rank's step: forward and backward, and the optimizer step, timed
on real tensors (on CPU in this process, the parent, while no worker runs; on a GPU in a child process, the
device synchronized at each edge) at the rank's micro-batch and thread count: the median step, with the load other
processes put on the machine meanwhile and matrix products re-timed beside it, so that a calibration taken on a
busy machine says so. This machine's predictions only: a preset's compute comes from the GPU operator model
(harness.prediction.gpu_model), which times nothing here."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import pickle
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from hydra.utils import instantiate

from amp import AmpSpec, OptimizerSpec
from amp.native import NativeAmp
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.inputs import Inputs, inputs_of, loss_for
from harness.prediction.trace import hashable, model_builder

WARMUP_STEPS = 2
MIN_STEPS, MAX_STEPS, MIN_SECONDS = 5, 20, 0.5
BUSY_CORES = 0.25  # other processes' use of the CPU during a calibration beyond which it is flagged
SLOW_GEMM = 0.75  # matrix products re-measured beside the model slower than this share of this machine's rate: flagged


@dataclass(frozen=True)
class Calibration:
    forward_backward_s: float  # one optimizer step's forward and backward passes (every micro-batch): the median
    optimizer_s: float
    steps: int
    micro_batch: int
    threads: int
    best_forward_backward_s: float = 0.0  # the best, beside the median: their gap is the timing's own spread
    background_cores: float = 0.0  # cores other processes kept busy meanwhile (steal time included)
    gemm_ratio: float | None = None  # float32 products timed beside the model / this machine's cached rate
    # one tensor-parallel rank's first forward and backward: the peak of the tensors it allocated (activations, the
    # gradients backward made, the inputs), measured on the CPU (None where not measured)
    pass_peak_bytes: int | None = None

    @property
    def busy(self) -> str | None:
        """Why this calibration cannot be trusted (the machine was busy), or None."""
        if self.background_cores > BUSY_CORES:
            return f"other processes kept {self.background_cores:.2f} cores busy while it was timed"
        if self.gemm_ratio is not None and self.gemm_ratio < SLOW_GEMM:
            return (f"matrix products ran at {self.gemm_ratio:.0%} of this machine's measured rate beside it (another "
                    "process, or the host)")
        return None

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "busy": self.busy}


@contextlib.contextmanager
def background_load() -> Iterator[list[float]]:
    """Yields a list that gets the cores other processes (and the hypervisor: steal) used while inside: the
    system's busy CPU time less this process's and its children's, over the wall time."""
    import psutil

    me = psutil.Process()

    def busy() -> float:
        t = psutil.cpu_times()
        return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + \
            getattr(t, "steal", 0.0)

    def own() -> float:
        t = me.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    before, mine, started = busy(), own(), time.perf_counter()
    out: list[float] = []
    try:
        yield out
    finally:
        wall = max(time.perf_counter() - started, 1e-9)
        out.append(max(0.0, ((busy() - before) - (own() - mine)) / wall))


def gemm_ratio(threads: int, device: str) -> float | None:
    """float32 matrix products timed now over this machine's cached rate at `threads` (None: none cached)."""
    from harness.prediction.hardware import gemm_tflops, read_machine

    cached = read_machine().get("rates", {}).get(f"{device}:{threads}", {}).get("float32")
    if not cached:
        return None
    return gemm_tflops(torch.float32, threads, device, 4096 if device == "cuda" else 512) / cached


def timed_steps(forward_backward: Callable[[], None], step: Callable[[], None], sync: Callable[[], None],
                micro_batch: int, threads: int, device: str = "cpu") -> Calibration:
    """WARMUP_STEPS untimed, then at least MIN_STEPS and MIN_SECONDS (at most MAX_STEPS) timed, the device
    synchronized at each edge: their median (what a run's median window is compared with; the best step
    predicted 15-25 % low on this VM, benchmark 13), the best beside it, the other processes' load meanwhile,
    and matrix products re-timed just before: a busy machine is flagged, not hidden in a best-of."""
    ratio = gemm_ratio(threads, device)
    with background_load() as load:
        passes, steps = _timed(forward_backward, step, sync)
    return Calibration(statistics.median(passes), statistics.median(steps), len(passes), micro_batch, threads,
                       min(passes), load[0], ratio)


def _timed(forward_backward: Callable[[], None], step: Callable[[], None], sync: Callable[[], None],
           ) -> tuple[list[float], list[float]]:
    passes, steps = [], []
    started = time.perf_counter()
    for index in range(WARMUP_STEPS + MAX_STEPS):
        sync()
        begin = time.perf_counter()
        forward_backward()
        sync()
        middle = time.perf_counter()
        step()
        sync()
        end = time.perf_counter()
        if index >= WARMUP_STEPS:
            passes.append(middle - begin)
            steps.append(end - middle)
            if len(passes) >= MIN_STEPS and end - started >= MIN_SECONDS:
                break
    return passes, steps


def calibrate(model_cfg: Mapping[str, Any], inputs: Inputs, amp: AmpSpec, optim: Mapping[str, Any],
              micro_batch: int, grad_accum: int, threads: int, device: str = "cpu") -> Calibration:
    """On `device` "cuda" the calibration runs in a child process (child_context) on the first visible GPU: the parent
    never creates a CUDA context (its workers, forked or not, own the GPUs)."""
    args = (hashable(model_cfg), inputs, amp, hashable(optim), micro_batch, grad_accum, threads)
    if device == "cuda":
        return _in_child(*args, "cuda")
    return _calibrate(*args, "cpu")


@functools.lru_cache(maxsize=32)
def _in_child(*args: Any) -> Calibration:
    """`_measure` in a child process: the plain function, which pickles by its name (the cached `_calibrate`
    is another object under that name, which pickle refuses: no GPU run with plan.calibration=model was predicted)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=child_context()) as pool:
        return pool.submit(_measure, *args).result()


def _measure(model_cfg: tuple[tuple[str, Any], ...], inputs: Inputs, amp: AmpSpec,
             optim: tuple[tuple[str, Any], ...], micro_batch: int, grad_accum: int,
             threads: int, device_type: str) -> Calibration:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    device = torch.device(device_type)
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    try:
        torch.manual_seed(0)
        model = model_builder({k: list(v) if isinstance(v, tuple) else v for k, v in model_cfg}, inputs)()
        plugin = NativeAmp(dataclasses.replace(amp, allow_emulated=True), device)
        model = plugin.cast_module(model.to(device))
        optimizer = OptimizerSpec.from_config(dict(optim)).build(plugin.optimizer_params(model))
        model = plugin.wrap_module(model).train()
        loss_of = loss_for(model)
        images, labels = inputs.example(micro_batch * grad_accum, device)
        def forward_backward() -> None:
            for part, part_labels in zip(images.chunk(grad_accum), labels.chunk(grad_accum), strict=True):
                with plugin.forward_context():
                    loss = loss_of(model(part), part_labels) / grad_accum
                plugin.backward(loss)

        def step() -> None:
            plugin.step(optimizer)
            plugin.zero_grad(optimizer)

        with plugin.kernels():
            return timed_steps(forward_backward, step, sync, micro_batch, threads, device_type)
    finally:
        torch.set_num_threads(previous)


_calibrate = functools.lru_cache(maxsize=32)(_measure)  # in-process (CPU): each combination once


# ---- through the strategy itself, one process: what its wrapper and hooks cost beside the model ----

_pool: Any = None


def child_context() -> Any:
    """The calibration child comes from the process's fork server where there is one (Linux): a fresh process
    that has run nothing, forked from a server that has imported torch once, which the sweep's runs then fork
    from too (harness.launch.launcher sets what it preloads before predictions start); else spawned."""
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def calibrate_strategy(cfg: RunConfig, placement: Placement, amp: AmpSpec, micro_batch: int,
                       tensor_parallel: int = 1, pipeline_batch: int = 0, data_parallel: int = 1) -> Calibration:
    """The run's own strategy, amp plugin and optimizer set up by the strategy's own phases in a process group of
    one (gloo on CPU, nccl on a GPU), timed as `calibrate` times the bare model: DDP's buckets and hooks, ZeRO's
    and FSDP2's bookkeeping are in it; what crosses a link between ranks is left to harness.prediction.links.
    `tensor_parallel` > 1: one rank of a tensor-parallel group of that many, in a fake process group of that size
    (torch's FakeProcessGroup: every collective returns at once, its outputs as this rank's own), so that what is
    timed is one rank's slices of the weights and DTensor's dispatch around them, not the whole model.
    `pipeline_batch` > 0 (strategy=pp): the process's batch, which a pipeline's ranks gather whole; the model, one
    stage, runs its `micro_batch`-sized microbatches through the strategy's schedule (PipelineSchedule), so that what
    the schedule's own work costs is in it.
    `data_parallel` > 1 (FSDP2 over the whole world): one rank of that many in a fake process group, so that what
    FSDP2 does around each unit's gather and reduce-scatter at a world of more than one (the gather's copies in and
    out, which it skips in a group of one) is timed, and its optimizer steps one rank's shard.
    Runs in a child (child_context) kept for the parent's calibrations (the parent joins no process group and creates no
    CUDA context); `shutdown()` ends it."""
    one = dataclasses.replace(placement, nprocs=1, gpus=placement.gpus[:1], torch_indices=placement.torch_indices[:1],
                              devices=placement.devices[:1], global_batch=pipeline_batch or placement.local_batch,
                              nodes=1, batch_group=1) \
        if placement.one_process_per_device else placement
    # what the step depends on, not the run's bookkeeping (its round, iterations, folders): a sweep's later rounds
    # read the first's calibration
    key = json.dumps([dict(cfg.strategy), dict(cfg.model), dict(cfg.optim), dataclasses.asdict(cfg.data), cfg.amp_plugin,
                      cfg.grad_accum, cfg.seed, one.as_dict(), amp.as_dict(), micro_batch, tensor_parallel,
                      pipeline_batch, data_parallel],
                     sort_keys=True, default=str)
    global _pool
    if key not in _CALIBRATED:
        if _pool is None:
            from concurrent.futures import ProcessPoolExecutor

            _pool = ProcessPoolExecutor(1, mp_context=child_context())
        _CALIBRATED[key] = _pool.submit(_strategy_child, pickle.dumps((cfg, one, amp, pipeline_batch or micro_batch,
                                                                       tensor_parallel, data_parallel))).result()
    return _CALIBRATED[key]


_CALIBRATED: dict[str, Calibration] = {}


def fake_process_group(world_size: int) -> None:
    """Rank 0 of a process group of `world_size` whose collectives do nothing (torch's own fake backend, which its
    tests use to trace distributed programs in one process; an internal module, so it is imported here only)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def shutdown() -> None:
    """End the calibration child (before workers start: it must hold no device while runs are measured)."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True)
        _pool = None


def _strategy_child(key: bytes) -> Calibration:
    import os
    import socket

    from amp import build_amp
    from strategies.base import RankEnv
    from strategies.capabilities import no_sync_for, pipeline_schedule_of

    cfg, placement, amp, micro_batch, tensor_parallel, data_parallel = pickle.loads(key)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    os.environ.update(placement.worker_env)
    spec = dataclasses.replace(amp, allow_emulated=True)
    threads = placement.threads_per_process
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    strategy = instantiate(cfg.strategy)
    if tensor_parallel * data_parallel > 1:
        fake_process_group(tensor_parallel * data_parallel)
    try:
        strategy.setup(RankEnv(0, 0, 1, placement, cfg.dist.timeout_s, cfg.grad_accum))
        torch.manual_seed(cfg.seed)
        inputs = inputs_of(cfg.model, cfg.data)
        model = model_builder(cfg.model, inputs)()  # as a rank builds it: the harness's checkpointing applied
        plugin = build_amp(cfg.amp_plugin, spec, strategy.device)
        model, optimizer = strategy.setup_module(model, plugin, OptimizerSpec.from_config(cfg.optim))
        model.train()
        loss_of = loss_for(model)
        images, labels = inputs.example(micro_batch * cfg.grad_accum, strategy.device)  # a TP rank: its group's
        parts = list(zip(images.chunk(cfg.grad_accum), labels.chunk(cfg.grad_accum), strict=True))

        def sync_skipped(last: bool) -> contextlib.AbstractContextManager[Any]:
            return contextlib.nullcontext() if last else no_sync_for(strategy, model)
        pipelined = pipeline_schedule_of(model)

        def forward_backward() -> None:
            if pipelined is not None:  # the schedule runs the microbatches' forwards and backwards itself
                pipelined.forward_backward((images, labels), plugin)
                return
            for k, (part, part_labels) in enumerate(parts):
                last = k == len(parts) - 1
                # a new context for each `with`: a generator's context manager is spent once entered (entering
                # the same one again raised AttributeError, and no run with grad_accum > 1 was predicted)
                with sync_skipped(last), plugin.forward_context():
                    loss = loss_of(model(part), part_labels) / cfg.grad_accum
                with sync_skipped(last):
                    plugin.backward(loss)

        def step() -> None:
            plugin.step(optimizer)
            plugin.zero_grad(optimizer)

        with plugin.kernels():
            peak = None
            if tensor_parallel > 1 and strategy.device.type == "cpu":
                # one rank's forward and backward on its slices: its activations and gradients, measured (the
                # trace has the whole model's); the optimizer's state is made by the step after
                from harness.core.tensor_peak import TensorPeak

                probe = TensorPeak().start()
                forward_backward()
                peak = probe.stop()
                plugin.zero_grad(optimizer)
            timed = timed_steps(forward_backward, step, strategy.synchronize, micro_batch, threads,
                                strategy.device.type)
            return dataclasses.replace(timed, pass_peak_bytes=peak)
    finally:
        if strategy.is_set_up:
            strategy.teardown()
        torch.set_num_threads(previous)
