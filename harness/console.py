"""What a person sees at the end of a run: windows, throughput, memory per device and per PID."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def print_run_summary(results: dict[str, Any], run_dir: Path, console: Console | None = None) -> None:
    console = console or Console()
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
    console.print(windows)

    memory = results.get("memory") or {}
    if memory.get("per_device"):
        table = Table(title=f"memory (source: {memory.get('source')})", title_justify="left")
        for column in ("device", "peak MiB", "baseline MiB", "PIDs (rank)"):
            table.add_column(column, justify="right")
        for dev in memory["per_device"]:
            pids = [f"{p['pid']} ({p['rank'] if p['rank'] is not None else p.get('role', '?')})"
                    for p in memory.get("per_process", []) if p["device"] == dev["device"]]
            table.add_row(dev["device"], f"{dev['peak_mib']:.1f}", f"{dev['baseline_mib']:.1f}", ", ".join(pids))
        console.print(table)
    throughput = results.get("throughput_img_s")
    line = f"status [bold]{results['status']}[/bold]"
    if throughput:
        line += f" · steady-state {throughput:.1f} img/s"
    if results.get("startup_seconds") is not None:
        line += f" · startup {results['startup_seconds']:.1f} s"
    if results.get("error"):
        line += f" · {escape(results['error'])}"
    console.print(line, highlight=False, markup=True)
    console.print(f"results: {run_dir / 'results.json'}", highlight=False)
