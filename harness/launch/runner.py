"""One run from the parent's side: validate, place, sample memory, launch, merge, write results."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
from hydra.utils import get_class

from amp import AmpSpec
from harness.core.compile_cache import prepare_compile_cache
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.rank_record import RankRecord, merge_figures
from harness.core.results import (
    PARAMETERS_NAME,
    SCHEMA,
    CompileCache,
    DeviceMemory,
    Environment,
    GpuActivity,
    MachineLoad,
    Memory,
    Parity,
    Precision,
    PredictionError,
    PredictionRecord,
    ProcessMemory,
    Profile,
    RunRecord,
    WindowRecord,
    environment,
    record_of,
    write_results,
)
from harness.core.stops import (
    STOP_SIGNALS,
    Interrupted,
    StopRequest,
    caused_by,
    ctrl_c_lost,
    last_line,
    stopped_by,
)
from harness.core.timing import Window, data_wait_share, merge_ranks, steady_throughput
from harness.launch.activity import activity_section, steady_spans
from harness.launch.launcher import WorkerFailure, launch_workers
from harness.launch.machine_load import LoadReadings, machine_section
from harness.memory import imbalance
from harness.memory.sampler import MemorySampler, RankProcess, SamplerFindings, open_source, summarize
from harness.parity.merge import run_parity
from harness.prediction.predict import Prediction
from harness.profile.merge import profile_section
from harness.rank.run_plan import LauncherIdentity, RankSpec, RunPlan
from harness.rank.worker import run_rank

log = logging.getLogger(__name__)


class Unavailable(RuntimeError):
    """An optional package the run needs is missing: an error for one run, a `skipped` row in a sweep."""


def command_start_time() -> float:
    return psutil.Process().create_time()


def execute(decided: RunPlan, run_dir: Path, in_sweep: bool, overrides: list[str] | None = None,
            repeat_label: str = "") -> RunRecord:
    """Run one combination as planned (harness.launch.decide) and write its results.json; return its record.

    Raises, outside sweeps, Unavailable before anything starts.
    Raises KeyboardInterrupt after the results are written if the run was interrupted.
    """
    started = time.time()
    cfg, placement = decided.config, decided.placement
    base = planned(decided, overrides)
    if decided.unavailable is not None and decided.skip is None and not in_sweep:
        raise Unavailable(decided.unavailable)
    reason = decided.skipped_because(in_sweep)
    if reason is not None:
        return _not_run(run_dir, base, decided, reason)

    prediction = decided.prediction  # made before the first run (harness.cli.check_runs), else now
    if prediction is None and cfg.plan.predict:
        prediction = predict_run(decided)
    elif prediction is not None:
        say_predicted(decided.label, prediction)
    from harness.prediction.calibrate import shutdown

    shutdown()  # a calibration child started for this run ends before its workers start
    if prediction is not None:
        decided = decided.predicted(prediction)
        base = replace(base, prediction=record_of(PredictionRecord, prediction.as_dict()))
        if not prediction.fits and cfg.plan.enforce:
            return _not_run(run_dir, base, decided, f"{prediction.misfit()} (plan.enforce=false starts it anyway)")

    for note in placement.notes:
        log.info("note: %s", note)
    if cfg.compile:  # before any worker starts
        base = replace(base, compile_cache=record_of(CompileCache, prepare_compile_cache()))
    record_dir = run_dir / "ranks"
    launched = decided.launched
    spec = RankSpec(plan=decided, record_dir=str(record_dir), parameters_path=str(run_dir / PARAMETERS_NAME),
                    log_file=str(run_dir / "run.log") if launched else None, repeat_label=repeat_label,
                    launcher=LauncherIdentity(os.getpid(), psutil.Process().create_time()) if launched else None)
    launcher_pid = os.getpid()
    source, warning = open_source(placement.accelerator, placement.gpus, launcher_pid, placement.gpu_tokens) \
        if cfg.memory.enabled else (None, None)
    if warning:
        log.warning("%s", warning)
    env_extra = _describe_source(source)
    sampler = MemorySampler(source, cfg.memory.interval_ms / 1000).start() if source else None
    load = LoadReadings(launcher_pid, LOAD_INTERVAL_S).start()
    failures: list[WorkerFailure] = []
    interrupted: str | None = None
    launching = time.time()
    try:
        with _signals_as_interrupt():
            if launched:
                failures = launch_workers(run_rank, spec, placement, cfg.dist.start_timeout_s,
                                          str(run_dir / "logs"), cfg.launcher.name, cfg.launcher.start_method)
            else:
                try:
                    run_rank(spec)
                except Exception as error:  # the rank's own failure: its record names it, else this line
                    if caused_by(error, (KeyboardInterrupt, Interrupted)):
                        raise
                    failures = [WorkerFailure(rank=0, pid=os.getpid(), exitcode=1, message=last_line(error))]
    except (KeyboardInterrupt, Interrupted) as error:
        interrupted = str(error) or "interrupted (SIGINT)"
    except Exception as error:
        if type(error).__name__ == "SignalException":  # the elastic agent forwarding SIGINT/SIGTERM
            interrupted = f"stopped by {error.sigval.name}"
        else:  # the launcher itself failed (rendezvous timeout, spawn error): a failed run, not a crash
            failures = [WorkerFailure(rank=-1, pid=None, exitcode=1, message=f"launcher: {last_line(error)}")]
    finally:
        load.stop()
        if sampler is not None:
            sampler.stop()

    await_ranks(record_dir)
    returned = time.time()
    records = read_records(record_dir)
    failures += silent_deaths(record_dir, records, failures)
    status, error = run_status(records, failures, interrupted)
    activity, energy = gpu_activity(sampler, records, cfg.batch_size * cfg.log_every)
    record = replace(measured(base, decided, records, started, run_dir), status=status, error=error,
                     memory=memory_section(sampler, placement.devices,
                                           records + _unrecorded(failures, records, placement), launcher_pid, warning),
                     gpu_activity=activity, energy_j_per_image=energy,
                     machine=machine_load(load, sampler, records, cfg.timing.busy_share),
                     env=record_of(Environment, environment(env_extra)), round=cfg.round, place=cfg.place,
                     after=cfg.after, finished_at=(finished := time.time()))
    record = replace(record, phases=phases(started, launching, returned, finished, records, launched,
                                           record.compile_seconds))
    if prediction is not None:
        record = predicted_against(record, prediction, records, decided)
    record = publish(run_dir, record)
    if interrupted:
        raise KeyboardInterrupt(interrupted)
    return record


def predicted_against(record: RunRecord, prediction: Prediction, records: list[RankRecord],
                      decided: RunPlan) -> RunRecord:
    """The prediction's error against what the run measured, and the MFU at the measured pace (or why not)."""
    mfu, refused = plausible_mfu(
        model_flops_utilisation(prediction.flops_per_iteration, prediction.peak_tflops, record.throughput_img_s,
                                decided.config.batch_size, decided.device_ranks),
        prediction.peak_tflops, prediction.peak_source)
    if refused:
        log.warning("[%s] %s", decided.label, refused)
    return replace(record, mfu=mfu, notes=[*record.notes, refused] if refused else record.notes,
                   prediction_error=prediction_error(prediction.peak_mib, prediction.s_per_iteration, record, records))


def predict_run(decided: RunPlan, quiet: bool = False) -> Prediction | None:
    """The run predicted on this machine before it starts (harness.prediction); None, saying why, where the planner
    cannot (a strategy it has no model of, a trace that fails). Raises ConfigError where the user's own model
    code raised in the planner's step (harness.launch.model_check.raised_in_users_code): the run would fail too,
    after its start-up, so it is refused in one line instead."""
    from harness.core.errors import ConfigError
    from harness.launch.model_check import raised_in_users_code, users_model
    from harness.prediction.predict import NotPredictable, predict
    from harness.prediction.targets import local_target

    cfg, placement = decided.config, decided.placement
    try:
        prediction = predict(cfg, placement, decided.amp, decided.strategy_cls,
                             local_target(placement.accelerator, decided.device_ranks, placement.threads_per_process))
    except NotPredictable as error:
        log.log(logging.DEBUG if quiet else logging.INFO, "[%s] not predicted: %s", decided.label, error)
        return None
    except Exception as error:  # noqa: BLE001 (a prediction never stops a run, unless the user's model raised)
        where = raised_in_users_code(cfg.model, error)
        if where is not None:
            raise ConfigError("model._target_", cfg.model["_target_"],
                              f"a model whose training step runs: [{decided.label}] the planner's step of it raised "
                              f"in its own code, {where}") from error
        whose = "the planner's trace cannot step this model; the run goes on" if users_model(cfg.model) else \
            "a bug of the planner's on a shipped model, please report it; the run goes on"
        log.log(logging.DEBUG if quiet else logging.WARNING, "[%s] not predicted (%s): %s", decided.label, whose,
                last_line(error))
        return None
    if not quiet:
        say_predicted(decided.label, prediction)
    return prediction


def model_flops_utilisation(flops_per_iteration: int | None, peak_tflops: float | None,
                            throughput: float | None, global_batch: int, devices: int) -> float | None:
    """The FLOPs one iteration does (torch's FLOP counter over the traced step, every rank's batch) at the measured
    pace, over what the devices could do at their peak in the dtype the run computes in."""
    if not (flops_per_iteration and peak_tflops and throughput and devices):
        return None
    return flops_per_iteration * (throughput / global_batch) / (devices * peak_tflops * 1e12)


def plausible_mfu(mfu: float | None, peak_tflops: float | None, peak_source: str) -> tuple[float | None, str | None]:
    """The MFU, or None and why: above 100 % the peak it was divided by is wrong, and no figure is better than
    one that says a run beat its hardware (an H200's run once showed 87,771 %)."""
    if mfu is None or mfu <= 1:
        return mfu, None
    return None, (f"MFU not reported: the run computed {mfu:.0%} of the peak {peak_tflops:.4g} TFLOP/s "
                  f"({peak_source}), so that peak is wrong")


def say_predicted(label: str, prediction: Prediction) -> None:
    log.info("[%s] predicted: peak %.1f MiB per rank, %.4f s per iteration", label, prediction.peak_mib,
             prediction.s_per_iteration)


def _not_run(run_dir: Path, base: RunRecord, decided: RunPlan, reason: str) -> RunRecord:
    """results.json of a combination that measured nothing here, with its reason."""
    record = replace(base, status="skipped", error=reason).checked()
    write_results(run_dir, record)
    log.info("[%s] skipped: %s", decided.label, record.error)
    return record


def prediction_error(peak_mib: float, s_per_iteration: float | None, record: RunRecord,
                     records: list[RankRecord]) -> PredictionError:
    """(measured - predicted) / measured for the peak (GPU: the caching allocator's reserved peak, the largest
    device's; CPU: the largest rank's live-tensor peak) and the time per iteration (the steady windows')."""
    reserved = [p.max_reserved_mib for r in records for p in r.allocator]
    probed = [r.tensor_peak_mib for r in records if r.tensor_peak_mib is not None]
    measured_peak, source = (max(reserved), "torch-allocator") if reserved else \
        (max(probed), "live-tensor-probe") if probed else (None, None)
    throughput = record.throughput_img_s
    measured_s = record.global_batch / throughput if throughput and record.global_batch else None

    def error(measured: float | None, predicted: float | None) -> float | None:
        return (measured - predicted) / measured if measured and predicted is not None else None

    return PredictionError(peak_mib=error(measured_peak, peak_mib), s_per_iteration=error(measured_s, s_per_iteration),
                           measured_peak_mib=measured_peak, measured_s_per_iteration=measured_s, memory_source=source)


def phases(started: float, launching: float, returned: float, finished: float, records: list[RankRecord],
           launched: bool, compile_seconds: float | None) -> dict[str, float]:
    """Where the run's wall time went (results.json's `phases`, in PHASES' order), from the launcher's stamps and
    each rank's. The run waits for its slowest rank at every stage, so each phase runs from the moment the last
    rank finished the one before to the moment the last rank finished it: the phases add up to the run's wall
    time (a rank slow to import and another slow to build are not counted twice). Only phases every rank
    stamped are given."""
    stamps = [r.times for r in records]
    if not stamps or not all(s.loop_ended for s in stamps):
        return {}

    def last(stage: str) -> float:
        return max(getattr(s, stage) or 0.0 for s in stamps)

    first_iteration = max(r.first_iter_time or 0.0 for r in records)
    ended = max(r.ended_at or 0.0 for r in records)
    edges = [("prepare", launching)]
    if launched:
        edges += [("process_start", last("process_started")), ("imports", last("entered"))]
    edges += [("process_group", last("group_ready")), ("build", last("built")),
              ("to_first_iteration", first_iteration), ("windows", last("loop_ended")), ("after_loop", ended),
              ("teardown", returned), ("results", finished)]
    result, previous = {}, started
    for name, edge in edges:
        result[name] = edge - previous - (compile_seconds or 0.0 if name == "to_first_iteration" else 0.0)
        previous = max(previous, edge)
    return {k: round(max(v, 0.0), 4) for k, v in result.items()}


def await_ranks(record_dir: Path, grace_s: float = 10.0) -> None:
    """Every rank process that started (its pid file) has ended before the records are read. A launcher can lose
    track of its workers: forked ones are the fork server's children, and a signal that reaches the whole job
    (SLURM's SIGUSR2 at the time limit) ends the server at once, so the agent saw them "exit" while they were
    still writing their records. Any still alive after `grace_s` are killed (their record is then missing)."""
    procs = []
    for path in record_dir.glob("rank*.pid"):
        try:
            pid_text, _, started = path.read_text().partition(" ")
            proc = psutil.Process(int(pid_text))
            if proc.pid != os.getpid() and abs(proc.create_time() - float(started)) < 0.05:  # not a reused PID
                procs.append(proc)
        except (ValueError, OSError, psutil.Error):
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass


SILENT_DEATH = ("ended without writing its record (os._exit, SIGKILL, the kernel's OOM killer or a crash below "
                "Python)")


def silent_deaths(record_dir: Path, records: list[RankRecord], failures: list[WorkerFailure]) -> list[WorkerFailure]:
    """Ranks that started (their pid file) but wrote no record and that the launcher did not report: the
    elastic agent reports only the first failed rank it finds, and when a killed rank's neighbour fails on the
    broken connection at once, that may be the neighbour. A rank with no record died abruptly: the cause."""
    known = {r.rank for r in records} | {f.rank for f in failures}
    found = []
    for path in sorted(record_dir.glob("rank*.pid")):
        rank = int(path.stem.removeprefix("rank"))
        if rank not in known:
            pid = int(path.read_text().split(" ")[0] or 0) or None
            found.append(WorkerFailure(rank=rank, pid=pid, exitcode=-1, message=SILENT_DEATH))
    return found


def _unrecorded(failures: list[WorkerFailure], records: list[RankRecord], placement: Placement) -> list[RankRecord]:
    """Ranks that died without a record (SIGKILL, the kernel's OOM killer): the sampler still saw them."""
    recorded = {r.rank for r in records}
    return [RankRecord(rank=f.rank, pid=f.pid, device=placement.rank_device(f.rank), host=socket.gethostname())
            for f in failures if f.pid is not None and 0 <= f.rank < placement.nprocs and f.rank not in recorded]


def memory_section(sampler: MemorySampler | SamplerFindings | None, devices: tuple[str, ...], records: list[RankRecord],
                   launcher_pid: int, warning: str | None) -> Memory:
    """The sampler's view joined with the ranks' records; the allocator's peaks where no sampler ran."""
    if sampler is None:
        return _allocator_memory(records, warning)
    if sampler.tracker.samples == 0:  # NVML opened but every query failed: no figure is better than 0 MiB
        return _allocator_memory(records, f"{sampler.warning or 'the memory sampler took no sample'}; "
                                          "figures are torch's allocator peaks")
    ranks = [RankProcess(r.rank, r.pid, r.device, r.host, r.rss_at_start_mib, tuple(r.data_pids)) for r in records]
    memory = record_of(Memory, summarize(sampler.tracker, sampler.source_name, devices, ranks, launcher_pid))
    return replace(memory, warning=sampler.warning) if sampler.warning else memory


def gpu_activity(sampler: MemorySampler | None, records: list[RankRecord],
                 images_per_window: int) -> tuple[GpuActivity | None, float | None]:
    """NVML's utilisation, clock, power and energy over rank 0's steady windows, and the energy an image (neither
    where NVML read none)."""
    reference = _steady_reference(records)
    if sampler is None or not sampler.tracker.activity or reference is None:
        return None, None
    spans = steady_spans(reference.windows, reference.window_spans)
    activity, per_image = activity_section(sampler.tracker.activity, spans, images_per_window * len(spans),
                                           sampler.unsupported)
    return record_of(GpuActivity, activity), per_image


LOAD_INTERVAL_S = 0.1  # a reading costs ~1 ms of the launcher's time (it lists the process tree)


def _steady_reference(records: list[RankRecord]) -> RankRecord | None:
    """Rank 0's record, when it timed windows: every machine-wide figure is taken over its steady windows."""
    return next((r for r in records if r.rank == 0 and r.window_spans), None)


def machine_load(load: LoadReadings, sampler: MemorySampler | None, records: list[RankRecord],
                 busy_share: float) -> MachineLoad:
    """How busy the machine was during rank 0's steady windows (harness.launch.machine_load)."""
    reference = _steady_reference(records)
    spans = steady_spans(reference.windows, reference.window_spans) if reference else []
    others_gpu = None
    if sampler is not None:
        seen = [value for at, per in sampler.tracker.activity if any(a <= at <= b for a, b in spans)
                for device in per.values() if (value := device.get("others_sm_pct")) is not None]
        others_gpu = max(seen) if seen else None
    return record_of(MachineLoad, machine_section(load.readings, spans, psutil.cpu_count() or 1, load.load_before,
                                                  others_gpu, busy_share))


def publish(run_dir: Path, record: RunRecord) -> RunRecord:
    """Write results.json (checked as a record: no type the schema lacks), show the run, and its memory balance
    when it spans devices."""
    record = record.checked()
    write_results(run_dir, record)
    _log_summary(record, run_dir)
    if len(record.memory.per_device) >= 2:
        balance = imbalance.write(record, run_dir)
        log.info("memory balance (%s): %s", balance.layout, balance.verdict)
        for flag in balance.flags:
            log.info("  ! %s", flag)
    return record


_held = StopRequest()  # stop signals that came before this process's run started: hold_stop_signals()


def hold_stop_signals() -> None:
    """For a process started to run one combination (a SLURM job), from its very start: a stop signal that
    comes before the run starts (scancel's SIGTERM, the time-limit warning's SIGUSR2) is kept, and the run
    then stops at once, on record, instead of the process dying unrecorded (SIGUSR2's default action) or
    submitit ending the job with an error of its own."""
    _held.install()


@contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGUSR2 to the launcher end the run: workers stopped, partial results written.
    Installed explicitly: a shell starting us in the background leaves SIGINT ignored.

    Only the first signal raises. A second one (`timeout -s INT` signals this process, then its whole group; a
    scheduler or an impatient user signals twice) would otherwise land inside the stop under way: in the
    launcher's logging (swallowed there as a "--- Logging error ---" traceback) or in the wait for the workers
    to end. From the first signal on, further ones are ignored until the process exits (exit 130, after the
    results and a sweep's report are written); SIGKILL still ends it at once."""
    fired: list[str] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not fired:
            fired.append(name)
            for sig in STOP_SIGNALS:
                signal.signal(sig, _while_stopping)
        raise Interrupted(stopped_by(name))

    try:
        previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    except ValueError:  # not the main thread (e.g. a launcher plugin's thread): leave signals alone
        yield
        return
    try:
        _held.check()
        if ctrl_c_lost():
            raise Interrupted(stopped_by("SIGINT"))
        yield
        if fired:  # raised where something swallowed it (a library's logging): the run was still stopped
            raise Interrupted(stopped_by(fired[0]))
    finally:
        if not fired:
            for sig, old in previous.items():
                signal.signal(sig, old)


def _while_stopping(signum: int, frame: FrameType | None) -> None:
    """A stop signal after the first: the run is already stopping (see _signals_as_interrupt)."""


def planned(decided: RunPlan, overrides: list[str] | None) -> RunRecord:
    """results.json's record as the plan decides it, before anything is measured: the combination, where its ranks
    go, its amp level as resolved; every other field keeps RunRecord's default (the status `failed` until the
    run ends, as a rank's record says)."""
    cfg, placement = decided.config, decided.placement
    variant = variant_fields(cfg)
    return RunRecord(
        schema=SCHEMA, status="failed", strategy=cfg.strategy_name, amp=cfg.amp.level, model=cfg.model_name,
        launcher=f"{cfg.launcher.name}/{cfg.launcher.start_method}", devices=list(placement.devices),
        accelerator=placement.accelerator, world_size=placement.world_size, nodes=placement.nodes,
        global_batch=cfg.batch_size, local_batch=placement.local_batch, image_size=decided.inputs.image_size,
        sample=decided.inputs.kind, tokens_per_sample=decided.inputs.tokens_per_sample, iterations=cfg.iterations,
        iterations_requested=cfg.iterations or "auto", log_every=cfg.log_every, warmup_windows=cfg.warmup_windows,
        threads_per_process=placement.threads_per_process, notes=list(placement.notes),
        precision=_amp_record(decided.amp), launcher_pid=os.getpid(), overrides=list(overrides or []),
        config=dict(decided.resolved), started_at=time.time(), strategy_options=variant.strategy_options,
        variant=variant.variant, compile=variant.compile, grad_accum=variant.grad_accum)


@dataclass(frozen=True)
class Variant:
    """What sets a run apart from its strategy's plain form: RunRecord's fields of the same names."""

    strategy_options: dict[str, Any]
    variant: str  # the short form the report puts in the row's label (e.g. `comm_hook=bf16 compile grad_accum=4`)
    compile: bool
    grad_accum: int

    def as_fields(self) -> dict[str, Any]:
        """As keyword arguments of RunRecord (a record made from a config dict: harness.cli.record_not_run)."""
        return asdict(self)


def variant_fields(cfg: RunConfig) -> Variant:
    """The strategy's options, compile, grad_accum, and the short `variant` the report puts in the row's label."""
    parts = [get_class(cfg.strategy["_target_"]).variant(cfg.strategy), "compile" if cfg.compile else "",
             f"grad_accum={cfg.grad_accum}" if cfg.grad_accum > 1 else ""]
    return Variant(strategy_options={k: v for k, v in cfg.strategy.items() if k != "_target_"},
                   variant=" ".join(p for p in parts if p), compile=cfg.compile, grad_accum=cfg.grad_accum)


def _amp_record(amp: AmpSpec, state: Mapping[str, Any] | None = None) -> Precision:
    """results.json's `precision`: the amp level as resolved on this machine, and (`state`: rank 0's amp plugin's
    at the end) its loss scaling's outcome."""
    state = state or {}
    return Precision(level=amp.level, impl=amp.impl, dtype=amp.dtype, master_weights=amp.master_weights,
                     keep_batchnorm_fp32=amp.keep_batchnorm_fp32, loss_scale=amp.loss_scale,
                     final_loss_scale=state.get("final_loss_scale"), skipped_steps=state.get("skipped_steps"))


def read_records(record_dir: Path) -> list[RankRecord]:
    """Every rank's record. Records are written atomically (a rank killed mid-write leaves only a hidden temp
    file), so an unreadable one is a real fault: it is named on stderr, not silently dropped."""
    records = []
    for path in sorted(record_dir.glob("rank*.json")):
        try:
            records.append(RankRecord.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, TypeError) as error:
            log.warning("rank record %s is unreadable (%s); that rank counts as unrecorded", path, error)
    return sorted(records, key=lambda r: r.rank)


def run_status(records: list[RankRecord], failures: list[WorkerFailure], interrupted: str | None) -> tuple[str, str | None]:
    """The run's status and the root cause: a rank that died without a record went first (the others
    wrote theirs on the way out); otherwise the earliest rank to fail, not its neighbours' broken pipes."""
    if interrupted:
        return "interrupted", interrupted
    recorded = {r.rank for r in records}
    for failure in failures:
        if failure.rank not in recorded:
            return "failed", f"rank {failure.rank} (pid {failure.pid}): {failure.message}"
    bad = sorted((r for r in records if r.status in ("failed", "oom")), key=lambda r: r.ended_at or 0)
    if bad:
        first = bad[0]
        return first.status, f"rank {first.rank} (pid {first.pid}): {first.error}"
    if failures:
        f = failures[0]
        return "failed", f"rank {f.rank} (pid {f.pid}): {f.message}"
    if not records or any(not r.ok for r in records):
        return "failed", "a worker ended without a record"
    return "ok", None


def measured(base: RunRecord, decided: RunPlan, records: list[RankRecord], started: float,
             run_dir: Path = Path()) -> RunRecord:
    """`base` (the plan's record) with what the ranks' records measured, merged: every figure RankRecord declares
    `merged`, as declared there (rank 0's, the slowest rank's compile time, ...) and by attribute, so that a
    figure added there needs no line here; the run's windows its slowest rank's, and what is computed from them.
    The one figure said here is compile time's XLA fallback: graphs compiled inside the windows, no pass apart."""
    cfg = decided.config
    figures = merge_figures(records)
    per_rank = {r.rank: r.windows for r in records}
    windows = merge_ranks(list(per_rank.values()), cfg.warmup_windows)
    firsts = [r.first_iter_time for r in records if r.first_iter_time]
    # XLA compiles its graphs as the first iterations run: inside the warm-up windows, not in start-up
    in_windows = [r.window_compile_seconds for r in records if r.window_compile_seconds is not None]
    compile_seconds = figures["compile_seconds"]  # the ranks compile side by side: the slowest's
    if compile_seconds is None and in_windows:
        figures["compile_seconds"] = max(in_windows)
    auto = cfg.iterations is None  # iterations=auto: how many the ranks ran
    samples_s = steady_throughput(windows, cfg.batch_size, cfg.log_every)
    parity = run_parity(cfg, decided.placement, records)
    zero = next((r for r in records if r.rank == 0), None)
    return replace(
        base,
        **figures,
        iterations=(windows[-1].end_iter if windows else None) if auto else base.iterations,
        windows=[_window(w) for w in windows],
        per_rank_windows={str(rank): [_window(w) for w in ws] for rank, ws in per_rank.items()},
        throughput_img_s=samples_s,
        throughput_tokens_s=samples_s * decided.inputs.tokens_per_sample
        if samples_s is not None and decided.inputs.tokens_per_sample else None,
        data_wait_share=data_wait_share(windows),
        profile=record_of(Profile, profile_section(records, windows, run_dir)) if cfg.profile else None,
        startup_seconds=(max(firsts) - started - (compile_seconds or 0)) if firsts else None,
        command_startup_seconds=(max(firsts) - command_start_time() - (compile_seconds or 0)) if firsts else None,
        precision=_amp_record(decided.amp, zero.amp_state if zero else None),
        parity=record_of(Parity, parity) if parity else None,
        ranks=[r.summary() for r in records],
    )


def _window(window: Window) -> WindowRecord:
    return WindowRecord(**window.as_dict())


def _allocator_memory(records: list[RankRecord], warning: str | None) -> Memory:
    """Without a sampler (disabled, or no NVML): the ranks' own allocator peaks, if any."""
    per_device = [DeviceMemory(device=peak.device, peak_mib=round(peak.max_reserved_mib, 1), baseline_mib=0.0)
                  for r in records for peak in r.allocator]
    per_process = [ProcessMemory(pid=r.pid, rank=r.rank, device=r.device, host=r.host,
                                 peak_mib=round(sum(p.max_reserved_mib for p in r.allocator), 1))
                   for r in records if r.allocator]
    return Memory(source="torch-allocator" if per_device else None, per_device=per_device, per_process=per_process,
                  warning=warning)


def _describe_source(source: Any) -> dict[str, Any]:
    """The driver version and GPU names for the results' `env` (NVML); why they are missing, if they are."""
    describe = getattr(source, "describe", None)
    try:
        return describe() if describe else {}
    except Exception as error:  # a driver that answers memory queries but not these: say so, go on
        return {"driver": None, "gpu_names": [], "describe_error": f"{type(error).__name__}: {error}"}


def _log_summary(results: RunRecord, run_dir: Path) -> None:
    from harness.launch.console import log_run_summary

    log_run_summary(results, run_dir)
