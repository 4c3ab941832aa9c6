"""`--project h100x8,h100x16-ib`: each finished row projected onto hardware presets (harness.prediction), with the
scaling plot: this machine's measurements and each preset's projections on panels of their own (a CPU process
and a GPU are not points on one axis).

A row is projected as weak scaling: each rank keeps the batch it had here (the global batch grows with the
devices), on every device of the preset that its strategy uses (one process per device: all of them, across
nodes; DataParallel: one node's; one-device strategies: one). The prediction is the planner's GPU operator
model (harness.prediction.gpu_model) with its band, from the published results it was fitted to; its assumptions
are listed with it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.utils import get_class

from harness.core.config import RunConfig
from harness.core.errors import ConfigError
from harness.report.rows import Row


def check_presets(names: Sequence[str]) -> None:
    from harness.prediction.hardware import load_preset

    for name in names:
        load_preset(name)


def project(rows: Sequence[Row], presets: Sequence[str]) -> list[dict[str, Any]]:
    """A projected row per (row that ran, preset)."""
    from harness.launch.on_preset import predict_on
    from harness.launch.placement import usable_cores
    from harness.prediction.hardware import load_preset
    from harness.prediction.predict import inputs_here

    projected = []
    for row in rows:
        if not row.ok_runs or not row.config or not row.local_batch:
            continue
        try:
            cfg = RunConfig.from_dict(row.config, row.strategy)
        except ConfigError as error:
            projected += [{"label": row.label, "strategy": row.strategy, "hardware": p, "status": "not projected",
                           "reason": str(error)} for p in presets]
            continue
        strategy_cls = get_class(cfg.strategy["_target_"])
        cfg = _as_on_a_gpu(cfg, row.overrides)
        for name in presets:
            preset = load_preset(name)
            devices = preset.devices if strategy_cls.one_process_per_device else \
                preset.devices_per_node if strategy_cls.drives_all_devices else 1
            per_rank = row.local_batch if strategy_cls.one_process_per_device or not row.devices else \
                row.local_batch // max(1, len(row.devices)) if strategy_cls.drives_all_devices else row.local_batch
            scaled = dataclasses.replace(cfg, batch_size=per_rank * devices, gpus=None)
            result = predict_on(scaled, name, usable_cores())
            prediction = result.get("prediction") or {}
            tokens = inputs_here(scaled).tokens_per_sample
            projected.append({"label": row.label, "strategy": row.strategy, "amp": row.amp, "hardware": name,
                              "devices": devices, "global_batch": per_rank * devices, "status": result["status"],
                              "reason": result.get("reason"), "throughput_img_s": prediction.get("throughput_img_s"),
                              "s_per_iteration": prediction.get("s_per_iteration"),
                              "peak_mib": prediction.get("peak_mib"), "fits": prediction.get("fits"),
                              "throughput_band": prediction.get("throughput_band"), "mfu": prediction.get("mfu"),
                              "unit": "tokens/s" if tokens else "img/s", "per_sample": tokens or 1,
                              "band_source": prediction.get("band_source", ""),
                              "assumptions": prediction.get("assumptions", [])})
    return projected


def _as_on_a_gpu(cfg: RunConfig, overrides: Sequence[str]) -> RunConfig:
    """The run's kernel settings as they would default on a GPU (kernels.channels_last), except those the command
    line chose: a run measured here recorded this machine's defaults, not the preset's."""
    from harness.core.config import KernelsConfig
    from harness.core.defaults import gpu_defaults

    typed = {o.lstrip("+~").split("=")[0] for o in overrides}
    on_gpu = {k: v for k, v in gpu_defaults(KernelsConfig).items() if f"kernels.{k}" not in typed}
    return dataclasses.replace(cfg, kernels=dataclasses.replace(cfg.kernels, **on_gpu))


HEADERS = ("combination", "hardware", "devices", "global batch", "rate", "90 % band", "MFU", "peak MiB/rank", "fits",
           "note")


def _cells(p: dict[str, Any]) -> list[str]:
    """A row in the workload's own units: img/s, or tokens/s for a language model (its sequences x their tokens)."""
    band = p.get("throughput_band") or (None, None)
    scale = p.get("per_sample", 1)
    rate = p.get("throughput_img_s")
    return [p["label"], p["hardware"], str(p.get("devices", "—")), str(p.get("global_batch", "—")),
            "—" if rate is None else f"{rate * scale:,.0f} {p.get('unit', 'img/s')}",
            f"{_num(band[0] and band[0] * scale, 0)}–{_num(band[1] and band[1] * scale, 0)}" if band[0] and band[1]
            else "—", "—" if p.get("mfu") is None else f"{100 * p['mfu']:.1f} %", _num(p.get("peak_mib"), 1),
            "—" if p.get("fits") is None else "yes" if p["fits"] else "NO",
            (p["status"] if p["status"] != "predicted" else "") + (": " + p["reason"] if p.get("reason") else "")]


def sources(projected: Sequence[dict[str, Any]]) -> list[str]:
    return [s for s in dict.fromkeys(p.get("band_source") for p in projected) if s]


def markdown(projected: Sequence[dict[str, Any]]) -> str:
    lines = ["## Projected past this machine (harness.prediction; weak scaling: each rank keeps its batch)", "",
             "| " + " | ".join(HEADERS) + " |", "|:---|:---|" + "---:|" * 6 + ":---|:---|"]
    lines += ["| " + " | ".join(_cells(p)) + " |" for p in projected]
    if sources(projected):
        lines += ["", "The band: " + "; ".join(sources(projected)) + " (harness/prediction/published.csv, benchmark 14)."]
    notes = dict.fromkeys(a for p in projected for a in p.get("assumptions", []))
    if notes:
        lines += ["", "Assumptions:", *[f"- {a}" for a in notes]]
    return "\n".join(lines) + "\n"


def terminal(projected: Sequence[dict[str, Any]]) -> str:
    """The projection as the terminal shows it: the table and where its band comes from."""
    from rich.table import Table

    from harness.launch.console import render

    table = Table(title="Projected past this machine (weak scaling: each rank keeps its batch)", title_justify="left")
    for name in HEADERS:
        table.add_column(name, justify="left" if name in ("combination", "hardware", "note") else "right")
    for p in projected:
        table.add_row(*_cells(p))
    band = "\nThe band: " + "; ".join(sources(projected)) if sources(projected) else ""
    return render(table, width=140) + band


def _num(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def scaling_plot(rows: Sequence[Row], projected: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Two panels: throughput measured here against processes, and projected against each preset's devices
    (with the band as error bars). Kept apart: this machine's CPU processes and a preset's GPUs share no axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.report.plots import DPI, WIDTH_IN, strategy_colours

    shown = [p for p in projected if p.get("throughput_img_s")]
    if not shown:
        return None
    colours = strategy_colours(rows)
    markers = dict(zip(dict.fromkeys(p["hardware"] for p in shown), "xsD^v<>p*h", strict=False))
    fig, (here_ax, there_ax) = plt.subplots(1, 2, figsize=(WIDTH_IN, 5), width_ratios=(1, 2), layout="constrained")
    for row in rows:
        if not row.throughput:
            continue
        colour = colours.get(row.strategy, "black")
        here_ax.plot([max(1, row.processes or len(row.devices) or 1)], [row.throughput], color=colour, marker="o",
                     linestyle="none", label=row.label)
        for p in (p for p in shown if p["label"] == row.label):  # one point per preset: no line joins two GPUs
            y = p["throughput_img_s"]
            low, high = p.get("throughput_band") or (y, y)
            there_ax.errorbar([p["devices"]], [y], yerr=[[y - (low or y)], [(high or y) - y]], color=colour,
                              marker=markers[p["hardware"]], linestyle="none", capsize=3, alpha=0.85,
                              label=f"{row.label} on {p['hardware']}")
    here_ax.set(xlabel="processes here", ylabel="images per second", title="Measured on this machine")
    here_ax.set_xticks(sorted({max(1, r.processes or len(r.devices) or 1) for r in rows if r.throughput}))
    presets = ", ".join(dict.fromkeys(p["hardware"] for p in shown))
    there_ax.set(xscale="log", yscale="log", xlabel="devices (log)", ylabel="images per second (log)",
                 title=f"Projected: {presets} (90 % band)")
    for ax in (here_ax, there_ax):
        ax.grid(alpha=0.3, which="both")
    there_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def html_section(projected: Sequence[dict[str, Any]], plot: str) -> str:
    """The page's projection section: the table with its band and the band's source, the assumptions, the
    scaling plot (an embedded image)."""
    import html

    head = "".join(f"<th>{h}</th>" for h in HEADERS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(p)) + "</tr>" for p in projected)
    band = (f"<p>The band: {html.escape('; '.join(sources(projected)))} (harness/prediction/published.csv, "
            "benchmark 14).</p>") if sources(projected) else ""
    notes = dict.fromkeys(a for p in projected for a in p.get("assumptions", []))
    items = "".join(f"<li>{html.escape(a)}</li>" for a in notes)
    return ('<section id="projection"><h2>Projected past this machine (weak scaling: each rank keeps its batch)</h2>'
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{band}"
            f"<p>Assumptions:</p><ul>{items}</ul>" + (f'<div class="figures">{plot}</div>' if plot else "")
            + "</section>")
