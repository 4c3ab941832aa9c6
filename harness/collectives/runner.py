"""The parent side: validate, place one worker per device, launch them, tabulate and write the outputs.

Timing differs from nccl-tests on purpose: each timed call follows a barrier and ends with a device sync;
a call's time is the slowest rank's, and the median over the repeats is reported (nccl-tests averages
back-to-back calls and then averages over ranks).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.collectives.arithmetic import OPS, bus_factor, format_size, table_rows
from harness.collectives.config import CollectivesConfig, placement_for
from harness.collectives.writers import to_markdown, write_csv, write_plot
from harness.core.results import environment, write_json_atomic
from harness.launch.placement import Hardware, probe_hardware

RESULTS_NAME = "collectives.json"  # not results.json: the strategy report gathers every results.json
log = logging.getLogger(__name__)


def run_benchmark(cfg_dict: Mapping[str, Any], out_dir: Path, hw: Hardware | None = None) -> dict[str, Any]:
    """Validate, place, launch, tabulate; raises ConfigError before anything starts on bad input."""
    started = time.time()
    cfg = CollectivesConfig.from_dict(cfg_dict.get("collectives") or {})
    placement = placement_for(cfg_dict, hw or probe_hardware())
    # torch.distributed: only when launching
    from harness.collectives.worker import CollectivesSpec, collectives_rank
    from harness.launch.launcher import launch_workers

    dist_cfg = {"timeout_s": 60, "start_timeout_s": 120, **(cfg_dict.get("dist") or {})}
    if placement.world_size < 2:
        log.info("note: one worker (%s): nothing crosses a link; use nprocs>=2 or two GPUs", placement.devices[0])
    record_dir = out_dir / "ranks"
    spec = CollectivesSpec(collectives=cfg, placement=placement, record_dir=str(record_dir),
                           timeout_s=dist_cfg["timeout_s"], log_file=str(out_dir / "collectives.log"))
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
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def remove_if_empty_run(run_dir: Path) -> None:
    """Refused before starting: leave no folder holding only Hydra's own files."""
    leftovers = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
    if leftovers <= {".hydra", "collectives.log"}:
        shutil.rmtree(run_dir, ignore_errors=True)

