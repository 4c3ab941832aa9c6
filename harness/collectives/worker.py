"""The rank side: one worker per device times every (op, size) the config asks for, its ranks agreeing
on what can run so that a failure on one rank never leaves the others waiting in a collective."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.collectives.arithmetic import element_count, format_size, table_row
from harness.collectives.config import CollectivesConfig
from harness.core.devices import Placement
from harness.core.logs import setup_worker
from harness.core.results import write_json_atomic

log = logging.getLogger(__name__)


def collective_call(op: str, count: int, dtype: torch.dtype, device: torch.device, rank: int,
                    n: int) -> Callable[[], None]:
    """One call of `op` on buffers allocated once here; rooted ops use rank 0 as the root."""
    full = torch.ones(count, dtype=dtype, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "broadcast":
        return lambda: dist.broadcast(full, src=0)
    if op == "reduce":
        return lambda: dist.reduce(full, dst=0)
    share = torch.ones(count // n, dtype=dtype, device=device)
    if op == "all_gather":
        gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather_into(full, share)
    if op == "reduce_scatter":
        scatter_from = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter_from(share, full)
    if op == "gather":
        parts = list(full.chunk(n)) if rank == 0 else None
        return lambda: dist.gather(share, parts, dst=0)
    if op == "scatter":
        parts = list(full.chunk(n)) if rank == 0 else None
        return lambda: dist.scatter(share, parts, src=0)
    if op == "sendrecv":
        if n < 2:
            raise RuntimeError("send/recv needs at least 2 ranks")
        received = torch.empty_like(full)

        def ring() -> None:  # nccl-tests' sendrecv: every rank sends to the next, receives from the previous
            ops = [dist.P2POp(dist.isend, full, (rank + 1) % n), dist.P2POp(dist.irecv, received, (rank - 1) % n)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return ring
    raise ValueError(f"unknown collective {op}")


@dataclass(frozen=True)
class CollectivesSpec:
    """What every benchmark worker is handed (pickled by the launcher, as a training rank's RankSpec is)."""

    collectives: CollectivesConfig
    placement: Placement
    record_dir: str
    timeout_s: float
    log_file: str | None = None


def collectives_rank(spec: CollectivesSpec) -> None:
    """Entry point of every benchmark worker (started by harness.launch.launcher, one per device)."""
    from harness.rank.worker import rank_identity
    from strategies.base import BareProcessGroup, RankEnv

    placement = spec.placement
    rank, local_rank, world = rank_identity()
    setup_worker(spec.log_file, rank)
    record_path = Path(spec.record_dir) / f"rank{rank}.json"
    torch.set_num_threads(placement.threads_per_process)
    group = BareProcessGroup()  # the device and process group exactly as DDP gets them
    group.setup(RankEnv(rank, local_rank, world, placement, spec.timeout_s))
    try:
        measured, unsupported = measure(spec.collectives, group, rank, world)
        if rank == 0:
            write_json_atomic(record_path, {"rank": rank, "status": "ok", "backend": dist.get_backend(),
                                            "measurements": measured, "unsupported": unsupported})
    except BaseException as error:
        write_json_atomic(record_path, {"rank": rank, "status": "failed", "error": f"{type(error).__name__}: {error}"})
        raise
    finally:
        group.teardown()


FAILURES = (RuntimeError, NotImplementedError, ValueError, MemoryError)  # torch.OutOfMemoryError is a RuntimeError


def measure(cfg: CollectivesConfig, group: Any, rank: int, n: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Per (op, size): `repeats` timed calls, each after a barrier and ending with a device sync.

    Whether a size can run is agreed across ranks before anything is timed: an op the backend lacks
    fails on every rank alike, but running out of memory may hit one rank only, and a rank that went
    on alone would leave its peers waiting in a different collective until the timeout."""
    dtype = getattr(torch, cfg.dtype)
    element_size = torch.empty((), dtype=dtype).element_size()
    agreement = Agreement(group.device)  # allocated before any large buffer: it must not run out itself
    measured: list[dict[str, Any]] = []
    unsupported: dict[str, str] = {}
    for op in cfg.ops:
        for size in cfg.sizes:
            count = element_count(op, size, n, element_size)
            call, error = None, None
            try:
                if cfg.fault_rank == rank and cfg.fault_size == size:
                    raise torch.OutOfMemoryError(f"injected fault (collectives.fault) at {format_size(size)} "
                                                 f"on rank {rank}")
                call = collective_call(op, count, dtype, group.device, rank, n)
            except FAILURES as failure:
                error = failure
            reason = agreement.failure(error)
            if reason is None:
                try:
                    for _ in range(cfg.warmup or 1):  # at least one untimed call: it also tells "unsupported"
                        call()
                    group.synchronize()
                except FAILURES as failure:
                    error = failure
                reason = agreement.failure(error)
            if reason is not None:  # every rank leaves this op together
                unsupported[op] = f"at {format_size(size)}: {reason}"
                del call
                group.barrier()
                break
            slowest = torch.tensor(timed_calls(call, group, cfg.repeats), dtype=torch.float64, device=group.device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a call is over when its last rank is done
            measured.append({"op": op, "size_bytes": count * element_size, "requested_bytes": size,
                             "count": count, "seconds": slowest.cpu().tolist(),
                             **({"after_compute": after_compute(cfg, call, group, n)} if cfg.times_after_compute(size) else {})})
            del call
        if rank == 0:
            done = [m for m in measured if m["op"] == op]
            peak = max((table_row(m, n)["busbw_gbs"] for m in done), default=0.0)
            note = f"{len(done)} sizes, peak busbw {peak:.2f} GB/s"
            if op in unsupported:
                note += f"; stopped {unsupported[op]}"
            log.info("[collectives] %-14s %s", op, note)
    return measured, unsupported


def after_compute(cfg: CollectivesConfig, call: Callable[[], None], group: Any, n: int) -> dict[str, list[float]]:
    """`repeats` calls after each of `after_compute_ms` of matrix products begun at a barrier, as a training step
    makes its calls; each call's time is its mean over the ranks (each rank's from the end of its own compute): the
    step waits for the last rank and the call, and a prediction counts one rank's compute already. By the gap in
    ms (a string: JSON's keys)."""
    a = torch.randn(256, 256, device=group.device)
    b = torch.randn(256, 256, device=group.device)
    found = {}
    for gap_ms in cfg.after_compute_ms:
        def compute(seconds: float = gap_ms / 1e3) -> None:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                torch.mm(a, b)
            group.synchronize()

        mean = torch.tensor(timed_calls(call, group, cfg.repeats, compute), dtype=torch.float64, device=group.device)
        dist.all_reduce(mean)
        found[f"{gap_ms:g}"] = (mean / n).cpu().tolist()
    return found


def timed_calls(call: Callable[[], None], group: Any, repeats: int,
                before: Callable[[], None] | None = None) -> list[float]:
    """This rank's seconds for `repeats` calls, each after a barrier (and `before`, untimed), to its device sync."""
    times = []
    for _ in range(repeats):
        group.barrier()
        if before is not None:
            before()
        start = time.perf_counter()
        call()
        group.synchronize()
        times.append(time.perf_counter() - start)
    return times


class Agreement:
    """Did every rank get through a step? One small all-reduce (MIN of "ok" flags) answers for all."""

    def __init__(self, device: torch.device) -> None:
        self._flag = torch.ones(1, dtype=torch.int32, device=device)

    def failure(self, error: BaseException | None) -> str | None:
        """None when every rank succeeded; otherwise the same reason on every rank (the first failing rank's)."""
        self._flag.fill_(0 if error is not None else 1)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MIN)
        if int(self._flag.item()) == 1:
            return None
        mine = None if error is None else f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
        reasons: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(reasons, mine)
        first = next(i for i, r in enumerate(reasons) if r is not None)
        return f"rank {first}: {reasons[first]}" if len(reasons) > 1 else reasons[first]

