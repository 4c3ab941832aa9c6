"""What a person sees at the end of a run: windows, throughput, memory per device and per PID.

Tables are drawn with rich into text and logged, so they reach the terminal and the run's run.log alike."""

from __future__ import annotations

import io
import logging
import shutil
import sys
from pathlib import Path

from rich.console import Console, RenderableType
from rich.table import Table

from harness.core.results import ProcessMemory, RunRecord

log = logging.getLogger(__name__)


def terminal_width() -> int:
    """The terminal's width; a wide page when the output goes to a file or a pipe (never wrapped there)."""
    return shutil.get_terminal_size((160, 24)).columns if sys.stdout.isatty() else 200


def render(*renderables: RenderableType, width: int | None = None) -> str:
    console = Console(file=io.StringIO(), width=width or terminal_width(), color_system=None, highlight=False,
                      soft_wrap=False)
    for renderable in renderables:
        console.print(renderable)
    return console.file.getvalue().rstrip("\n")  # type: ignore[attr-defined]


def rate_unit(sample: str | None, tokens_per_sample: int | None) -> str:
    """img/s for images, tok/s for token sequences, samples/s for a workload of one's own."""
    return "tok/s" if tokens_per_sample else "samples/s" if sample == "samples" else "img/s"


def run_summary(results: RunRecord) -> list[RenderableType]:
    title = (f"{results.strategy} · amp {results.amp} · {results.model} · "
             f"devices {','.join(results.devices)} · global batch {results.global_batch}")
    windows = Table(title=title, title_justify="left")
    tokens = results.tokens_per_sample or 0
    for column in ("iterations", "window s", "cumulative s", rate_unit(results.sample, tokens), "loss, rank 0", ""):
        windows.add_column(column, justify="right")
    per_window = (results.global_batch or 0) * (results.log_every or 0) * (tokens or 1)
    # the loss the live lines showed: rank 0's (the merged windows hold the mean over ranks, the report's figure)
    rank0 = {w.end_iter: w.loss for w in results.per_rank_windows.get("0", [])}
    for w in results.windows:
        rate = per_window / w.seconds if w.seconds > 0 else float("nan")
        own = rank0.get(w.end_iter, w.loss)
        loss = "" if own is None else f"{own:.4f}"
        windows.add_row(str(w.end_iter), f"{w.seconds:.3f}", f"{w.cumulative_seconds:.3f}",
                        f"{rate:.1f}", loss, "warm-up" if w.warmup else "profiled" if w.profiled else "")
    shown: list[RenderableType] = [windows]
    memory = results.memory
    if memory.per_device:
        table = Table(title=f"memory (source: {memory.source})", title_justify="left")
        for column in ("device", "peak MiB", "baseline MiB", "PIDs (rank)"):
            table.add_column(column, justify="right")
        for dev in memory.per_device:
            pids = [f"{p.pid} ({_who(p)})" for p in memory.per_process if p.device == dev.device]
            table.add_row(dev.device, f"{dev.peak_mib or 0.0:.1f}", f"{dev.baseline_mib or 0.0:.1f}", ", ".join(pids))
        shown.append(table)
    return shown


def _who(process: ProcessMemory) -> str:
    """'0' for rank 0, 'data of 0' for its DataLoader worker, else the role."""
    if process.role == "data":
        return f"data of {process.rank}"
    return str(process.rank) if process.rank is not None else process.role


def status_line(results: RunRecord) -> str:
    line = f"status {results.status}"
    if results.throughput_img_s and results.status == "ok":
        line += f" · steady-state {results.throughput_img_s:.1f} " + (
            f"sequences/s, {results.throughput_tokens_s:.0f} tokens/s" if results.throughput_tokens_s
            else rate_unit(results.sample, 0))
    elif results.windows and results.status != "ok":  # the report times finished runs only
        count = len(results.windows)
        line += f" · {count} window{'s' if count > 1 else ''} measured before it stopped, no steady-state figure"
    if results.data_wait_share is not None and results.data_wait_share >= 0.005:
        line += f" · data wait {100 * results.data_wait_share:.0f} % of steady time"
    if results.energy_j_per_image is not None:
        line += f" · {results.energy_j_per_image:.3g} J/image"
    if results.startup_seconds is not None:
        line += f" · startup {results.startup_seconds:.1f} s"
    if results.compile_seconds is not None:
        line += f" · compile {results.compile_seconds:.1f} s (outside the windows)"
    stopped = stop_reason(results)
    if stopped:
        line += f" · {stopped}"
    if results.error:
        line += f" · {results.error}"
    return line


def stop_reason(results: RunRecord) -> str | None:
    """iterations=auto: why the run stopped where it did."""
    if results.iterations_requested != "auto" or not results.stopped_by:
        return None
    timing = results.config.get("timing") or {}
    if results.stopped_by == "precision":
        return f"precision ±{timing.get('precision_pct', '?')} % reached at {results.iterations} iterations"
    return (f"timing.max_seconds ({timing.get('max_seconds', '?')} s) reached at {results.iterations} iterations, "
            f"before ±{timing.get('precision_pct', '?')} %")


def parity_line(results: RunRecord) -> str | None:
    """parity=true: the digest of what was trained, and whether the replicas agree."""
    if results.parity is None:
        return None
    digests = {d for d in results.parity.digests.values() if d}
    agree = {True: "replicas agree", False: f"replicas differ (ranks {results.parity.differing_ranks})",
             None: "one replica"}[results.parity.replicas_agree]
    shown = ", ".join(sorted(d[:12] for d in digests)) or "none"
    return f"parity: trained parameters' sha256 {shown} ({agree}); compared with its reference in the sweep's report"


def log_run_summary(results: RunRecord, run_dir: Path) -> None:
    log.info("%s", render(*run_summary(results)))
    log.info("%s", status_line(results))
    said = parity_line(results)
    if said:
        log.info("%s", said)
    breakdown = breakdown_line(results)
    if breakdown:
        log.info("%s", breakdown)
    log.info("results: %s", run_dir / "results.json")


def breakdown_line(results: RunRecord) -> str | None:
    """The profiled window in one line: where the slowest rank's time went."""
    run = results.profile.run if results.profile else None
    if not run or results.profile is None:
        return None
    shares = ", ".join(f"{part.replace('_', ' ')} {100 * share:.0f} %" for part, share in run["shares"].items())
    overlapped = run["communication_overlapped_s"]
    total = run["communication_total_s"]
    overlap = f"; communication overlapped with other work: {1000 * overlapped:.1f} of {1000 * total:.1f} ms" \
        if total > 0 else ""
    return (f"profiled window (iterations to {run['end_iter']}, rank {run['rank']}, {run['view']} view, "
            f"{run['span_s']:.3f} s): {shares}{overlap}; traces: {', '.join(results.profile.traces)}")
