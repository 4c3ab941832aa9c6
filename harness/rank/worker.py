"""One rank's life: set up its device and strategy, build model and precision, train, leave a record.

Workers get the parent's RunPlan (harness.rank.run_plan) and never run Hydra or re-read a config. Each rank
writes its RankRecord (harness.core.rank_record) to `<run>/ranks/rank<N>.json` once, after the timed loop or
when it fails, so whatever was measured survives a failing neighbour.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from hydra.utils import instantiate

from amp import OptimizerSpec, build_amp
from amp.base import Amp
from harness.core.compile_cache import use_compile_cache
from harness.core.config import FaultConfig, RunConfig
from harness.core.devices import DeviceOps
from harness.core.logs import setup_worker
from harness.core.rank_record import RankRecord, RankTimes
from harness.core.results import write_json_atomic
from harness.core.stops import (
    LAUNCHER_GONE_GRACE_S,
    Interrupted,
    LauncherWatch,
    StopRequest,
    caused_by,
    last_line,
)
from harness.core.tensor_peak import TensorPeak
from harness.core.timing import AutoStop, Window, WindowClock
from harness.memory.footprint import footprint, per_rank
from harness.parity.rank import rank_parity
from harness.profile.breakdown import breakdown
from harness.profile.rank import WindowProfiler, at_edges
from harness.rank import kernels
from harness.rank.checkpointing import build_model
from harness.rank.data import BatchSource, batch_source
from harness.rank.run_plan import RankSpec
from harness.rank.trainer import compile_pass, train
from strategies.base import RankEnv, Strategy, unwrap
from strategies.capabilities import compile_seconds_of, no_sync_for

log = logging.getLogger(__name__)


def rank_identity() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from the elastic agent's environment; 0, 0, 1 inline."""
    env = os.environ
    return int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1))


def fault_injector(fault: FaultConfig, rank: int, accelerator: str) -> Callable[[int], None]:
    """`fault.kind` at `fault.at_iter` on `fault.rank`; a no-op everywhere else."""
    if fault.kind is None or fault.rank != rank:
        return lambda it: None

    def fire(it: int) -> None:
        if it != fault.at_iter:
            return
        message = f"injected fault (fault.kind={fault.kind}) at iteration {it} on rank {rank}"
        if fault.kind == "exit":
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
            os._exit(13)
        if fault.kind == "oom":
            if accelerator == "cuda":  # a real one: ask the caching allocator for more than the GPU has free
                free, _ = torch.cuda.mem_get_info()
                torch.empty(free + 2**30, dtype=torch.uint8, device="cuda")
            raise MemoryError(message)  # CPU: the kernel would kill the process long before Python saw it
        raise RuntimeError(message)

    return fire


def progress_logger(label: str, global_batch: int, log_every: int, iterations: int | None,
                    tokens_per_sample: int | None = None, unit: str = "img/s") -> Callable[[Window], None]:
    """One line per window, logged after the window closed (the clock has been read): samples/s in `unit`, or a
    token model's tokens/s."""
    unit = "tok/s" if tokens_per_sample else unit

    def show(w: Window) -> None:
        rate = global_batch * log_every * (tokens_per_sample or 1) / w.seconds if w.seconds > 0 else float("nan")
        tag = "  (warm-up)" if w.warmup else "  (profiled)" if w.profiled else ""
        if w.data_wait_s is not None and w.seconds > 0 and w.data_wait_s >= 0.01 * w.seconds:
            tag = f"  data wait {100 * w.data_wait_s / w.seconds:.0f} %{tag}"
        log.info("[%s] iter %5d/%s  window %8.3f s  total %8.3f s  %9.1f %s  loss (rank 0) %.4f%s", label, w.end_iter,
                 iterations or "auto", w.seconds, w.cumulative_seconds, rate, unit, w.loss, tag)

    return show


PROBE_ITERATIONS = 2  # the live-tensor peak on CPU: from before the model is built to the end of iteration 2
MIB = 2**20


def probe_fits_warmup(cfg: RunConfig) -> bool:
    """The probe slows what it watches: only inside the warm-up window."""
    return cfg.warmup_windows >= 1 and cfg.log_every > PROBE_ITERATIONS


def set_up(strategy: Strategy, build: Callable[[], torch.nn.Module], amp: Amp,
           optimizer: OptimizerSpec) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model `build` makes, set up by the strategy, with what the set-up dropped freed before the first
    iteration: a strategy that replaces the model (strategy=pp keeps its stages of the pipeline's trace) leaves the
    rest in reference cycles (torch.export's wrapper module holds the model), which Python's collector frees
    whenever it next runs; until then every rank held the whole model's parameters (measured: strategy=pp's ranks
    peaked with all 53 of model=gpt's). Nobody outside holds the built model, so the collection frees it."""
    model, built = strategy.setup_module(build(), amp, optimizer)
    gc.collect()
    return model, built


def held_bytes(params: Iterable[torch.Tensor]) -> int:
    """What the parameters occupy on this rank: a sharded one (a DTensor) counts its local shard only."""
    local = (p.to_local() if hasattr(p, "to_local") else p for p in params)  # DTensor, not imported for this
    return sum(t.numel() * t.element_size() for t in local)


def run_rank(spec: RankSpec, before_teardown: Callable[[RankRecord], None] | None = None) -> RankRecord:
    """Entry point of every rank: inline for one-process strategies, via the elastic agent otherwise.

    `before_teardown(record)` runs while the process group is still up, after a successful run
    (under torchrun: gathering every rank's record to global rank 0)."""
    entered = time.time()
    plan = spec.plan
    cfg, placement = plan.config, plan.placement
    rank, local_rank, world_size = rank_identity()
    if spec.log_file is not None:  # a process of its own: Hydra set up the launcher's logging, not ours
        setup_worker(spec.log_file, rank)
    stop = StopRequest().install()
    watch = LauncherWatch(spec.launcher.pid, spec.launcher.create_time, LAUNCHER_GONE_GRACE_S,
                          cfg.dist.timeout_s).start() if spec.launcher is not None else None
    record_dir = Path(spec.record_dir)
    pid_file = record_dir / f"rank{rank}.pid"  # a rank that dies without a record is still known
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{os.getpid()} {psutil.Process().create_time()}")  # the start time tells a reused PID
    record = RankRecord(rank=rank, local_rank=local_rank, pid=os.getpid(), host=socket.gethostname(),
                        device=placement.rank_device(local_rank),
                        rss_at_start_mib=psutil.Process().memory_info().rss / 2**20,
                        times=RankTimes(process_started=psutil.Process().create_time(), entered=entered))
    clock: WindowClock | None = None
    probe: TensorPeak | None = None
    strategy = None
    batches: BatchSource | None = None
    held = contextlib.ExitStack()  # the amp plugin's kernel choice, over set-up, compile and the timed loop
    try:
        torch.set_num_threads(placement.threads_per_process)
        strategy = instantiate(cfg.strategy)
        strategy.setup(RankEnv(rank, local_rank, world_size, placement, cfg.dist.timeout_s, cfg.grad_accum))
        record.times.group_ready = time.time()
        record.backend = dist.get_backend() if dist.is_initialized() else None
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        probe = TensorPeak().start() if placement.accelerator == "cpu" and probe_fits_warmup(cfg) else None
        kernels.apply(cfg.kernels)
        layout = kernels.memory_format(cfg.kernels, plan.inputs)
        amp = build_amp(cfg.amp_plugin, plan.amp, strategy.device)
        held.enter_context(amp.kernels())

        def built() -> torch.nn.Module:
            model = build_model(cfg.model, plan.inputs.provided).to(memory_format=layout)  # blocks checkpointed
            record.kernels = kernels.in_effect(model, placement.accelerator)  # before a wrapper shards the weights
            return model

        model, optimizer = set_up(strategy, built, amp, OptimizerSpec.from_config(cfg.optim))
        record.params_held_mib = held_bytes(model.parameters()) / MIB
        shards, shard = (placement.data_shards, placement.data_shard(rank)) if placement.one_process_per_device \
            else (1, 0)  # a tensor-parallel group's ranks all read their group's share
        batches = batch_source(cfg.data, plan.inputs, cfg.batch_size, shards, shard, strategy.device, cfg.seed,
                               pid_dir=record_dir / f"data-pids-rank{rank}", memory_format=layout)
        profiler = WindowProfiler(cfg.warmup_windows, placement.accelerator, strategy.barrier) if cfg.profile else None
        no_sync = functools.partial(no_sync_for, strategy, model)
        record.times.built = time.time()
        if cfg.compile:  # compiled here, timed apart: neither start-up nor any window holds it
            use_compile_cache()  # the parent's folder (inherited), or under torchrun the default one
            model = strategy.compile(model)
            no_sync = functools.partial(no_sync_for, strategy, model)
            started_compile = time.perf_counter()
            compile_pass(model, amp, optimizer, batches.first(), cfg.grad_accum, no_sync, strategy.after_compile_pass)
            strategy.synchronize()
            record.compile_seconds = time.perf_counter() - started_compile
        strategy.ops.reset_peaks()
        source = batches
        clock = WindowClock(strategy.synchronize, cfg.warmup_windows, data_wait=lambda: source.waited,
                            profiled_window=profiler.window_index if profiler else None)
        strategy.barrier()
        stop.check()
        record.first_iter_time = time.time()
        label = " ".join(filter(None, (cfg.strategy_name, cfg.amp.level, spec.repeat_label)))
        inject = fault_injector(cfg.fault, rank, placement.accelerator)

        def before_step(it: int) -> None:  # a few attribute reads: nothing waits for the device
            stop.check()
            inject(it)
            if it == PROBE_ITERATIONS + 1 and probe is not None:
                record.tensor_peak_mib = probe.stop() / MIB  # type: ignore[operator]

        auto = None if cfg.iterations is not None else \
            AutoStop(cfg.timing.precision_pct, cfg.timing.max_seconds, strategy.max_over_ranks)
        losses: list[torch.Tensor] | None = [] if cfg.parity.enabled else None
        train(model, optimizer, amp, batches, clock, cfg.iterations, cfg.log_every, before_step=before_step,
              on_window=progress_logger(label, cfg.batch_size, cfg.log_every, cfg.iterations,
                                        plan.inputs.tokens_per_sample,
                                        "samples/s" if plan.inputs.kind == "samples" else "img/s"),
              decide=at_edges(profiler, auto), grad_accum=cfg.grad_accum, no_sync=no_sync, losses=losses)
        loop_ended = time.time()
        if probe is not None and record.tensor_peak_mib is None:
            record.tensor_peak_mib = probe.stop() / MIB  # type: ignore[operator]
        record.memory_theory = per_rank(footprint(unwrap(model), optimizer, amp.keeps_model_grads_at_step),
                                        world_size, strategy.shards, cfg.grad_accum,
                                        strategy.shard_degree(cfg.strategy, world_size))
        if losses is not None:  # after the last window edge: nothing here is timed (every rank calls it)
            path = spec.parameters_path
            record.parity = rank_parity(strategy.full_parameters(model), losses, model, rank,
                                        Path(path) if path else None)
        record.stopped_by = auto.reason if auto else None
        if profiler is not None:
            record.profile = profile_record(profiler, record_dir.parent / "traces" / f"rank{rank}.json")
        record.amp_state = amp.state()
        record.window_compile_seconds = compile_seconds_of(strategy)
        record.allocator = strategy.ops.allocator_peaks()
        record.status = "ok"
        record.times.loop_ended = loop_ended
        return record
    except BaseException as error:
        signal_error = caused_by(error, (Interrupted, KeyboardInterrupt))  # also when wrapped (instantiate)
        if signal_error is not None:
            record.status, record.error = "interrupted", last_line(signal_error)
            raise
        record.status = "oom" if DeviceOps.is_out_of_memory(error) else "failed"
        record.error = last_line(error)
        if strategy is not None and strategy.is_set_up:
            record.allocator = strategy.ops.allocator_peaks()
        raise
    finally:
        if probe is not None:
            probe.stop()  # a failed run: profiling off before anything else runs here
        held.close()
        record.ended_at = time.time()
        if clock is not None:
            record.windows = list(clock.windows)
            record.window_spans = list(clock.spans)
        if batches is not None:
            record.data_pids = batches.worker_pids()
            batches.close()
        write_json_atomic(record_dir / f"rank{rank}.json", record.to_json())
        if watch is not None:
            watch.record_written()  # from here the rank ends within dist.timeout_s, whoever it waits for
        try:
            if before_teardown is not None and record.ok:
                before_teardown(record)
        finally:
            if strategy is not None:
                strategy.teardown()
            stop.restore()
            # the watch is left running: after this the rank hands its record to the elastic agent and waits
            # for it to read it (torch's `_wrap`: queue_finished_reading_event.wait()), for ever if it is gone


def profile_record(profiler: WindowProfiler, trace: Path) -> dict[str, Any] | None:
    """The profiled window's trace, written, and where its time went (None: the run stopped before it closed)."""
    written = profiler.finish(trace)
    if written is None or profiler.window is None:
        return None
    return {"trace": str(written), "end_iter": profiler.window.end_iter, "window_s": profiler.window.seconds,
            **breakdown(written)}
