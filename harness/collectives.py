"""Collective-communication benchmark: how fast do the devices talk, op by op and size by size?

    python -m harness.collectives [nprocs=2] [gpus=[0,1]] [collectives.sizes=[4KiB,1MiB]] [collectives.ops=[all_reduce]]

Composes conf/collectives.yaml with Hydra, places one worker per device exactly as DDP runs are placed
(gloo on CPU, NCCL on GPUs) and starts them with the harness's elastic launcher. Each worker times
all_reduce, broadcast, reduce, all_gather, reduce_scatter, gather, scatter and a ring send/recv over
the message sizes, and the results land in runs/collectives/<timestamp>/: collectives.json (everything,
raw timings included), collectives.md and collectives.csv (the table) and bandwidth.png.

Bandwidths follow NVIDIA nccl-tests (doc/PERFORMANCE.md; gather/scatter/sendrecv from their sources):
algbw = S / t and busbw = algbw x factor, where S is the size in bytes (for all_gather, reduce_scatter,
gather and scatter: the total buffer, every rank's share together) and the factor is 2(n-1)/n for
all_reduce, (n-1)/n for all_gather, reduce_scatter, gather and scatter, and 1 for broadcast, reduce and
send/recv. GB/s means 1e9 bytes per second. Timing differs from nccl-tests on purpose: each timed call
follows a barrier and ends with a device sync; a call's time is the slowest rank's, and the median over
the repeats is reported (nccl-tests averages back-to-back calls and then averages over ranks).
"""

from __future__ import annotations

import csv
import logging
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.config import CONF_DIR, check_dist, check_gpus, check_nprocs
from harness.errors import ConfigError
from harness.output.logs import refusals, setup_worker
from harness.output.results import environment, write_json_atomic
from harness.rank.devices import Hardware, Placement, place, probe_hardware

OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather", "scatter", "sendrecv")
CHUNKED = ("all_gather", "reduce_scatter", "gather", "scatter")  # size = the total; each rank holds size/n
DTYPES = ("float32", "float16", "bfloat16", "float64")
GB = 1e9
RESULTS_NAME = "collectives.json"
log = logging.getLogger(__name__)  # not results.json: the strategy report gathers every results.json


# ---- nccl-tests arithmetic (pure functions) ----

def bus_factor(op: str, n: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth for `n` ranks."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in CHUNKED:
        return (n - 1) / n
    if op in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {op}")


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: bytes moved per second as the caller sees them."""
    return size_bytes / seconds / GB


def busbw(op: str, size_bytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth in GB/s, comparable with the hardware's link speed whatever the rank count."""
    return algbw(size_bytes, seconds) * bus_factor(op, n)


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30}


def parse_size(value: int | str) -> int:
    """4096, '4K', '4KiB', '64MiB', '1G' -> bytes (binary units, as nccl-tests' -b/-e)."""
    if isinstance(value, bool):
        raise ValueError(f"{value} is not a size")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{value} is not a positive size")
        return value
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS or int(match.group(1)) < 1:
        raise ValueError(f"{value} is not a size such as 4096, 4KiB, 64MiB or 1GiB")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def format_size(size_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale} {unit}"
    return f"{size_bytes} B"


def size_ladder(min_size: int, max_size: int, factor: int) -> list[int]:
    """min_size, min_size*factor, ... up to max_size (included when the ladder reaches it)."""
    sizes, size = [], min_size
    while size <= max_size:
        sizes.append(size)
        size *= factor
    return sizes


def element_count(op: str, size_bytes: int, n: int, element_size: int) -> int:
    """Elements in the op's (total) buffer: whole elements, and for chunked ops a multiple of n."""
    count = max(1, size_bytes // element_size)
    if op in CHUNKED:
        count = max(n, count // n * n)
    return count


# ---- configuration ----

@dataclass(frozen=True)
class CollectivesConfig:
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str
    warmup: int
    repeats: int
    fault_rank: int | None = None  # debugging aid: this rank runs out of memory at `fault_size`
    fault_size: int | None = None

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> CollectivesConfig:
        """Every check on the `collectives.*` keys, one line naming the key on failure."""
        known = {"ops", "sizes", "min_size", "max_size", "factor", "dtype", "warmup", "repeats", "fault"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(f"collectives.{unknown[0]}", section[unknown[0]], "one of " + ", ".join(sorted(known)))
        ops = section.get("ops") or ()
        if isinstance(ops, str):
            ops = [ops]
        bad = [op for op in ops if op not in OPS]
        if not ops or bad:
            raise ConfigError("collectives.ops", list(ops), "a list of " + ", ".join(OPS))
        if section.get("sizes"):
            sizes = section["sizes"] if isinstance(section["sizes"], list | tuple) else [section["sizes"]]
            sizes = [_size("collectives.sizes", s) for s in sizes]
        else:
            low = _size("collectives.min_size", section.get("min_size", "4KiB"))
            high = _size("collectives.max_size", section.get("max_size", "64MiB"))
            factor = section.get("factor", 2)
            if isinstance(factor, bool) or not isinstance(factor, int) or factor < 2:
                raise ConfigError("collectives.factor", factor, "an integer >= 2")
            if high < low:
                raise ConfigError("collectives.max_size", section.get("max_size"), "at least min_size")
            sizes = size_ladder(low, high, factor)
        dtype = section.get("dtype", "float32")
        if dtype not in DTYPES:
            raise ConfigError("collectives.dtype", dtype, "one of " + ", ".join(DTYPES))
        warmup, repeats = section.get("warmup", 2), section.get("repeats", 5)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ConfigError("collectives.warmup", warmup, "an integer >= 0")
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ConfigError("collectives.repeats", repeats, "an integer >= 1")
        fault = section.get("fault") or {}
        fault_rank, fault_size = fault.get("rank"), fault.get("size")
        if fault_rank is not None and (isinstance(fault_rank, bool) or not isinstance(fault_rank, int) or fault_rank < 0):
            raise ConfigError("collectives.fault.rank", fault_rank, "null or a rank >= 0")
        if fault_size is not None:
            fault_size = _size("collectives.fault.size", fault_size)
        return cls(ops=tuple(ops), sizes=tuple(sorted(set(sizes))), dtype=dtype, warmup=warmup, repeats=repeats,
                   fault_rank=fault_rank, fault_size=fault_size)


def _size(key: str, value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError as error:
        raise ConfigError(key, value, "a size such as 4096, 4KiB, 64MiB or 1GiB") from error


@dataclass(frozen=True)
class Request:
    """What placing the benchmark needs (harness.rank.devices.PlacementRequest), checked as run.py checks it."""

    strategy_name: str
    gpus: tuple[int, ...] | None
    nprocs: int
    batch_size: int


def placement_for(cfg: Mapping[str, Any], hw: Hardware) -> Placement:
    """Placed as a DDP run is: `gpus`/`nprocs`/`dist` get the very checks config.yaml's keys get."""
    gpus = check_gpus(cfg.get("gpus"))
    nprocs = check_nprocs(cfg.get("nprocs", 2))
    check_dist(cfg.get("dist") or {})
    workers = (len(gpus) if gpus is not None else len(hw.visible_gpus)) or nprocs
    return place(Request("collectives", gpus, nprocs, workers), hw, one_process_per_device=True,
                 drives_all_devices=False, needs_cuda=False)


# ---- the worker ----

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


def collectives_rank(spec: dict[str, Any]) -> None:
    """Entry point of every benchmark worker (started by harness.launch.launcher, one per device)."""
    from harness.rank.worker import rank_identity
    from strategies.base import ProcessGroupStrategy, RankEnv

    cfg = CollectivesConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec["collectives"].items()})
    placement = Placement.from_dict(spec["placement"])
    rank, local_rank, world = rank_identity()
    setup_worker(spec.get("log_file"), rank)
    record_path = Path(spec["record_dir"]) / f"rank{rank}.json"
    torch.set_num_threads(placement.threads_per_process)
    group = ProcessGroupStrategy()  # the device and process group exactly as DDP gets them
    group.setup(RankEnv(rank, local_rank, world, placement, spec["timeout_s"]))
    try:
        measured, unsupported = measure(cfg, group, rank, world)
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
            times = []
            for _ in range(cfg.repeats):
                group.barrier()
                start = time.perf_counter()
                call()
                group.synchronize()
                times.append(time.perf_counter() - start)
            slowest = torch.tensor(times, dtype=torch.float64, device=group.device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a call is over when its last rank is done
            measured.append({"op": op, "size_bytes": count * element_size, "requested_bytes": size,
                             "count": count, "seconds": slowest.cpu().tolist()})
            del call
        if rank == 0:
            done = [m for m in measured if m["op"] == op]
            peak = max((_row(m, n)["busbw_gbs"] for m in done), default=0.0)
            note = f"{len(done)} sizes, peak busbw {peak:.2f} GB/s"
            if op in unsupported:
                note += f"; stopped {unsupported[op]}"
            log.info("[collectives] %-14s %s", op, note)
    return measured, unsupported


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


# ---- the table ----

def _row(m: Mapping[str, Any], n: int) -> dict[str, Any]:
    seconds = statistics.median(m["seconds"])
    return {"op": m["op"], "size_bytes": m["size_bytes"], "count": m["count"], "time_us": seconds * 1e6,
            "time_us_min": min(m["seconds"]) * 1e6, "time_us_max": max(m["seconds"]) * 1e6,
            "algbw_gbs": algbw(m["size_bytes"], seconds), "busbw_gbs": busbw(m["op"], m["size_bytes"], seconds, n),
            "bus_factor": bus_factor(m["op"], n), "repeats": len(m["seconds"])}


def table_rows(measured: Sequence[Mapping[str, Any]], n: int) -> list[dict[str, Any]]:
    return [_row(m, n) for m in measured]


COLUMNS = ("op", "size", "size_bytes", "count", "time_us", "time_us_min", "time_us_max", "algbw_gbs",
           "busbw_gbs", "bus_factor")


def to_markdown(rows: Sequence[Mapping[str, Any]], header: Mapping[str, Any], unsupported: Mapping[str, str]) -> str:
    lines = ["# Collectives benchmark", "",
             f"{header['backend']} · {header['world_size']} ranks · devices {', '.join(header['devices'])} · "
             f"{header['dtype']} · {header['repeats']} timed calls per size after {header['warmup']} warm-up", "",
             "Time: median over the timed calls of the slowest rank's time (barrier before, device sync after). "
             "algbw = size / time; busbw = algbw × factor (nccl-tests: all_reduce 2(n−1)/n; all_gather, "
             "reduce_scatter, gather, scatter (n−1)/n; broadcast, reduce, sendrecv 1). For all_gather, "
             "reduce_scatter, gather and scatter the size is the total buffer. GB/s = 1e9 bytes/s.", "",
             "| op | size | bytes | time µs (median) | min–max µs | algbw GB/s | busbw GB/s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {format_size(r['size_bytes'])} | {r['size_bytes']} | {r['time_us']:.1f} | "
                     f"{r['time_us_min']:.1f}–{r['time_us_max']:.1f} | {r['algbw_gbs']:.3f} | {r['busbw_gbs']:.3f} |")
    for op, reason in unsupported.items():
        lines.append(f"| {op} | — | — | — | — | — | not measured {reason.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for r in rows:
            writer.writerow([format_size(r["size_bytes"]) if c == "size" else r[c] for c in COLUMNS])


def write_plot(rows: Sequence[Mapping[str, Any]], header: Mapping[str, Any], path: Path) -> Path | None:
    """Bus bandwidth and time against size, log axes, one line per op."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (bw_ax, time_ax) = plt.subplots(1, 2, figsize=(13, 5))
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        sizes = [r["size_bytes"] for r in mine]
        if all(r["busbw_gbs"] > 0 for r in mine):  # one rank: factors (n-1)/n are 0, nothing to draw on log axes
            bw_ax.plot(sizes, [r["busbw_gbs"] for r in mine], marker="o", label=op)
        time_ax.plot(sizes, [r["time_us"] for r in mine], marker="o", label=op)
    sized = FuncFormatter(lambda x, _: format_size(int(x)) if x >= 1 else "")
    for ax in (bw_ax, time_ax):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(sized)
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        ax.grid(alpha=0.3, which="both")
        ax.set_xlabel("message size (total buffer for gather-type ops)")
    bw_ax.set(ylabel="bus bandwidth (GB/s, nccl-tests convention)", title="Bus bandwidth")
    time_ax.set(ylabel="time per call (µs, median)", title="Latency")
    for ax in (bw_ax, time_ax):
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(f"{header['backend']} · {header['world_size']} ranks · {', '.join(header['devices'])} · "
                 f"{header['dtype']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- the parent ----

def run_benchmark(cfg_dict: Mapping[str, Any], out_dir: Path, hw: Hardware | None = None) -> dict[str, Any]:
    """Validate, place, launch, tabulate; raises ConfigError before anything starts on bad input."""
    started = time.time()
    cfg = CollectivesConfig.from_dict(cfg_dict.get("collectives") or {})
    placement = placement_for(cfg_dict, hw or probe_hardware())
    # The entry by its importable name, also when this file runs as __main__ (python -m harness.collectives).
    from harness.collectives import collectives_rank
    from harness.launch.launcher import launch_workers

    dist_cfg = {"timeout_s": 60, "start_timeout_s": 120, **(cfg_dict.get("dist") or {})}
    if placement.world_size < 2:
        log.info("note: one worker (%s): nothing crosses a link; use nprocs>=2 or two GPUs", placement.devices[0])
    record_dir = out_dir / "ranks"
    spec = {"collectives": asdict(cfg), "placement": placement.as_dict(), "record_dir": str(record_dir),
            "timeout_s": dist_cfg["timeout_s"], "log_file": str(out_dir / "collectives.log")}
    log.info("collectives: %d workers on %s, %d sizes %s–%s, %d warm-up + %d timed calls each", placement.world_size,
             ", ".join(placement.devices), len(cfg.sizes), format_size(cfg.sizes[0]), format_size(cfg.sizes[-1]),
             cfg.warmup, cfg.repeats)
    launch_error = None
    try:
        failures = launch_workers(collectives_rank, spec, placement, dist_cfg["start_timeout_s"],
                                  str(out_dir / "logs"))
    except Exception as error:  # rendezvous timeout, spawn error, the agent forwarding a signal
        failures, launch_error = [], f"launcher: {type(error).__name__}: {error}".strip()
    record = _read_json(record_dir / "rank0.json") or {}
    status, error = "ok", None
    if launch_error or failures or record.get("status") != "ok":
        status = "failed"
        first = failures[0] if failures else None
        error = launch_error or record.get("error") or (
            f"rank {first.rank} (pid {first.pid}): {first.message}" if first else "rank 0 left no record")
    n = placement.world_size
    rows = table_rows(record.get("measurements", []), n)
    unsupported = record.get("unsupported", {})
    header = {"backend": record.get("backend", "nccl" if placement.accelerator == "cuda" else "gloo"),
              "world_size": n, "devices": list(placement.devices), "dtype": cfg.dtype, "warmup": cfg.warmup,
              "repeats": cfg.repeats}
    outputs = []
    if rows or unsupported:
        (out_dir / "collectives.md").write_text(to_markdown(rows, header, unsupported))
        write_csv(rows, out_dir / "collectives.csv")
        outputs += [out_dir / "collectives.md", out_dir / "collectives.csv"]
        plot = write_plot(rows, header, out_dir / "bandwidth.png")
        outputs += [plot] if plot else []
    results = {"schema": 1, "kind": "collectives", "status": status, "error": error, **header,
               "accelerator": placement.accelerator, "sizes": list(cfg.sizes), "ops": list(cfg.ops),
               "conventions": {"algbw": "size_bytes / median seconds / 1e9",
                               "busbw_factor": {op: bus_factor(op, n) for op in OPS},
                               "size": "total buffer for all_gather, reduce_scatter, gather, scatter",
                               "time": "per call: max over ranks; reported: median over calls"},
               "rows": rows, "unsupported": unsupported, "raw": record.get("measurements", []),
               "config": dict(cfg_dict), "placement": placement.as_dict(), "env": environment(),
               "started_at": started, "finished_at": time.time(),
               "outputs": [str(p) for p in outputs]}
    write_json_atomic(out_dir / RESULTS_NAME, results)
    outputs.append(out_dir / RESULTS_NAME)
    if rows:
        log.info("%s", to_markdown(rows, header, unsupported))
    if error:
        log.error("%s", error)
    log.info("collectives: %s", ", ".join(str(p) for p in outputs))
    return results


def _read_json(path: Path) -> dict[str, Any] | None:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _remove_if_empty_run(run_dir: Path) -> None:
    """Refused before starting: leave no folder holding only Hydra's own files."""
    import shutil

    leftovers = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
    if leftovers <= {".hydra", "collectives.log"}:
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    """`python -m harness.collectives`: Hydra composes conf/collectives.yaml; exit 2 on bad input, 1 on failure."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    from harness.cli import EXIT_BAD_INPUT, EXIT_RUN_FAILED, register_resolvers

    register_resolvers()

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="collectives")
    def task(cfg: DictConfig) -> None:
        cfg_dict = OmegaConf.to_container(cfg, resolve=True)
        try:
            results = run_benchmark(cfg_dict, Path(HydraConfig.get().runtime.output_dir))
        except ConfigError as error:
            _remove_if_empty_run(Path(HydraConfig.get().runtime.output_dir))
            refusals().error("%s", error)
            sys.exit(EXIT_BAD_INPUT)
        if results["status"] != "ok":
            sys.exit(EXIT_RUN_FAILED)

    task()


if __name__ == "__main__":
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA numbers GPUs as nvidia-smi/NVML do
    main()
