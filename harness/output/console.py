"""What a person sees at the end of a run: windows, throughput, memory per device and per PID.

Tables are drawn with rich into text and logged, so they reach the terminal and the run's run.log alike."""

from __future__ import annotations

import io
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table

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


def run_summary(results: dict[str, Any]) -> list[RenderableType]:
    title = (f"{results['strategy']} · amp {results['amp']} · {results['model']} · "
             f"devices {','.join(results['devices'])} · global batch {results['global_batch']}")
    windows = Table(title=title, title_justify="left")
    for column in ("iterations", "window s", "cumulative s", "img/s", "loss", ""):
        windows.add_column(column, justify="right")
    per_window = results["global_batch"] * results["log_every"]
    for w in results["windows"]:
        rate = per_window / w["seconds"] if w["seconds"] > 0 else float("nan")
        loss = "" if w.get("loss") is None else f"{w['loss']:.4f}"
        windows.add_row(str(w["end_iter"]), f"{w['seconds']:.3f}", f"{w['cumulative_seconds']:.3f}",
                        f"{rate:.1f}", loss, "warm-up" if w["warmup"] else "")
    shown: list[RenderableType] = [windows]
    memory = results.get("memory") or {}
    if memory.get("per_device"):
        table = Table(title=f"memory (source: {memory.get('source')})", title_justify="left")
        for column in ("device", "peak MiB", "baseline MiB", "PIDs (rank)"):
            table.add_column(column, justify="right")
        for dev in memory["per_device"]:
            pids = [f"{p['pid']} ({p['rank'] if p['rank'] is not None else p.get('role', '?')})"
                    for p in memory.get("per_process", []) if p["device"] == dev["device"]]
            table.add_row(dev["device"], f"{dev['peak_mib']:.1f}", f"{dev['baseline_mib']:.1f}", ", ".join(pids))
        shown.append(table)
    return shown


def status_line(results: dict[str, Any]) -> str:
    line = f"status {results['status']}"
    if results.get("throughput_img_s"):
        line += f" · steady-state {results['throughput_img_s']:.1f} img/s"
    if results.get("startup_seconds") is not None:
        line += f" · startup {results['startup_seconds']:.1f} s"
    if results.get("error"):
        line += f" · {results['error']}"
    return line


def log_run_summary(results: dict[str, Any], run_dir: Path) -> None:
    log.info("%s", render(*run_summary(results)))
    log.info("%s", status_line(results))
    log.info("results: %s", run_dir / "results.json")
