"""Why does the base GPU take more memory, and how much? Worked out from a results file alone."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.results import ProcessMemory, RunRecord

IMBALANCE_THRESHOLD_PCT = 10.0  # below this the devices count as balanced


@dataclass
class Imbalance:
    devices: list[dict[str, Any]]  # device, used_mib (peak - baseline), pids
    base_device: str | None = None
    base_excess_mib: float | None = None
    base_excess_pct: float | None = None
    max_min_ratio: float | None = None
    layout: str = ""  # "one PID on every device" / "one PID per device" / ...
    flags: list[str] = field(default_factory=list)
    verdict: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _mib(value: float) -> str:
    return f"{value / 1024:.1f} GiB" if abs(value) >= 1024 else f"{value:.0f} MiB"


def analyze(results: RunRecord) -> Imbalance:
    memory = results.memory
    processes = memory.per_process
    rows = [{"device": d.device, "used_mib": max(0.0, (d.peak_mib or 0.0) - (d.baseline_mib or 0.0)),
             "pids": sorted({p.pid for p in processes if p.device == d.device and p.role != "data"})}
            for d in memory.per_device]
    report = Imbalance(devices=rows)
    if not rows:
        report.verdict = f"no per-device memory data (source: {memory.source}): nothing to compare"
        return report
    report.layout, report.flags = _pid_layout(results, processes)
    if len(rows) < 2:
        report.verdict = f"one device ({rows[0]['device']}, {_mib(rows[0]['used_mib'])}): nothing to compare"
        return report

    base, others = rows[0], rows[1:]
    others_mean = statistics.fmean(r["used_mib"] for r in others)
    used = [r["used_mib"] for r in rows]
    report.base_device = base["device"]
    report.base_excess_mib = base["used_mib"] - others_mean
    report.base_excess_pct = 100 * report.base_excess_mib / others_mean if others_mean > 0 else None
    report.max_min_ratio = max(used) / min(used) if min(used) > 0 else None
    report.verdict = _verdict(results, report)
    return report


def _pid_layout(results: RunRecord, processes: list[ProcessMemory]) -> tuple[str, list[str]]:
    rank_device = {r.rank: r.device for r in results.ranks}
    flags = []
    for p in processes:
        own = rank_device.get(p.rank) if p.rank is not None else None
        if p.role == "rank" and own is not None and p.device != own and (results.world_size or 1) > 1:
            held = "an unknown amount" if p.peak_mib is None else _mib(p.peak_mib)
            flags.append(f"PID {p.pid} (rank {p.rank}) holds {held} on {p.device}, "
                         f"not its own {own}: a stray CUDA context; call torch.cuda.set_device(local_rank) "
                         "before creating anything on the GPU")
        elif p.role == "other":
            flags.append(f"PID {p.pid} (not part of this run) appeared on {p.device} during the run")
        elif p.role == "unmatched":
            flags.append(f"PID {p.pid} on {p.device} is not a PID this run knows and could not be matched to a "
                         "rank (NVML inside a container reports the host's PIDs): its memory is not attributed")
    ranked = [p for p in processes if p.role == "rank"]
    pids = {(p.node, p.pid) for p in ranked}  # a PID is per node (containers repeat them)
    devices = {p.device for p in ranked}
    if not ranked:
        layout = "no per-process data"
    elif len(pids) == 1:
        layout = f"one PID ({next(iter(pids))[1]}) on {'every' if len(devices) > 1 else 'its'} device"
    elif len(pids) == len(devices) == len(ranked):
        layout = "one PID per device"
    else:
        layout = f"{len(pids)} PIDs over {len(devices)} devices"
    return layout, flags


def _verdict(results: RunRecord, report: Imbalance) -> str:
    if results.memory.source == "psutil":
        return _cpu_verdict(report)
    pct = report.base_excess_pct
    if pct is None or report.base_excess_mib is None:
        return "the other devices show no memory in use: cannot compare"
    if pct < IMBALANCE_THRESHOLD_PCT:
        ratio = f" (max/min {report.max_min_ratio:.2f})" if report.max_min_ratio else ""
        return f"memory is balanced across devices{ratio}"
    advice = ("DataParallel gathers outputs and reduces gradients there; DDP spreads memory evenly, "
              "or lower the batch") if results.world_size == 1 else \
        "look for work done on rank 0 only (logging, evaluation, a stray context)"
    return (f"base {report.base_device} uses {_mib(report.base_excess_mib)} ({pct:.0f}%) more than the "
            f"others; {advice}")


def _cpu_verdict(report: Imbalance) -> str:
    """On CPU a "device" is a worker process and its figure is resident memory grown during the run (model,
    activations, gradients, the collectives' buffers), not an accelerator's memory: there is no base GPU."""
    used = [d["used_mib"] for d in report.devices]
    spread = f"{_mib(min(used))}–{_mib(max(used))}"
    if report.base_excess_pct is not None and abs(report.base_excess_pct) >= IMBALANCE_THRESHOLD_PCT:
        return (f"CPU worker processes grew by {spread} of resident memory during the run; the first grew "
                f"{report.base_excess_pct:+.0f}% against the others' mean (process memory, not a GPU's)")
    return f"CPU worker processes grew by {spread} of resident memory during the run: balanced"


def to_markdown(results: RunRecord, report: Imbalance) -> str:
    lines = [f"# Memory balance: {results.strategy} · amp {results.amp} · {results.model}", "",
             f"Source: {results.memory.source}; PID layout: {report.layout}.", "",
             "| device | used MiB (peak − baseline) | PIDs |", "|---|---:|---|"]
    for row in report.devices:
        lines.append(f"| {row['device']} | {row['used_mib']:.1f} | {', '.join(map(str, row['pids']))} |")
    lines.append("")
    if report.base_excess_mib is not None:
        pct = "n/a" if report.base_excess_pct is None else f"{report.base_excess_pct:.1f}%"
        ratio = "n/a" if report.max_min_ratio is None else f"{report.max_min_ratio:.2f}"
        lines += [f"Base device {report.base_device}: {report.base_excess_mib:+.1f} MiB ({pct}) against the mean "
                  f"of the others; max/min {ratio}.", ""]
    lines += [f"- {flag}" for flag in report.flags]
    lines += ["", f"**Verdict:** {report.verdict}", ""]
    return "\n".join(lines)


def write(results: RunRecord, run_dir: Path) -> Imbalance:
    report = analyze(results)
    (run_dir / "imbalance.md").write_text(to_markdown(results, report))
    return report
