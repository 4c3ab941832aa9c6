"""`--project h100x8,h100x16-ib`: each finished row projected onto hardware presets (harness.plan), with the
scaling plot: measured points solid, projected ones dashed.

A row is projected as weak scaling: each rank keeps the batch it had here (the global batch grows with the
devices), on every device of the preset that its strategy uses (one process per device: all of them, across
nodes; DataParallel: one node's; one-device strategies: one). The prediction is the planner's, from this
machine's calibration scaled by the preset's peak rates and links: its assumptions are listed with it."""

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
    from harness.plan.hardware import load_preset

    for name in names:
        load_preset(name)


def project(rows: Sequence[Row], presets: Sequence[str]) -> list[dict[str, Any]]:
    """A projected row per (row that ran, preset)."""
    from harness.launch.on_preset import predict_on
    from harness.launch.placement import usable_cores
    from harness.plan.hardware import load_preset

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
        for name in presets:
            preset = load_preset(name)
            devices = preset.devices if strategy_cls.one_process_per_device else \
                preset.devices_per_node if strategy_cls.drives_all_devices else 1
            per_rank = row.local_batch if strategy_cls.one_process_per_device or not row.devices else \
                row.local_batch // max(1, len(row.devices)) if strategy_cls.drives_all_devices else row.local_batch
            scaled = dataclasses.replace(cfg, batch_size=per_rank * devices, gpus=None)
            result = predict_on(scaled, name, usable_cores())
            prediction = result.get("prediction") or {}
            projected.append({"label": row.label, "strategy": row.strategy, "amp": row.amp, "hardware": name,
                              "devices": devices, "global_batch": per_rank * devices, "status": result["status"],
                              "reason": result.get("reason"), "throughput_img_s": prediction.get("throughput_img_s"),
                              "s_per_iteration": prediction.get("s_per_iteration"),
                              "peak_mib": prediction.get("peak_mib"), "fits": prediction.get("fits"),
                              "assumptions": prediction.get("assumptions", [])})
    return projected


def markdown(projected: Sequence[dict[str, Any]]) -> str:
    lines = ["## Projected past this machine (harness.plan; weak scaling: each rank keeps its batch)", "",
             "| combination | hardware | devices | global batch | img/s | peak MiB/rank | fits | note |",
             "|:---|:---|---:|---:|---:|---:|:---|:---|"]
    for p in projected:
        lines.append(f"| {p['label']} | {p['hardware']} | {p.get('devices', '—')} | {p.get('global_batch', '—')} | "
                     f"{_num(p.get('throughput_img_s'), 0)} | {_num(p.get('peak_mib'), 1)} | "
                     f"{'—' if p.get('fits') is None else 'yes' if p['fits'] else 'NO'} | "
                     f"{p['status'] if p['status'] != 'predicted' else ''}{': ' + p['reason'] if p.get('reason') else ''} |")
    notes = dict.fromkeys(a for p in projected for a in p.get("assumptions", []))
    if notes:
        lines += ["", "Assumptions:", *[f"- {a}" for a in notes]]
    return "\n".join(lines) + "\n"


def _num(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def scaling_plot(rows: Sequence[Row], projected: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Throughput against devices, per combination: measured here (solid, markers), projected (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.report.plots import DPI, WIDTH_IN, strategy_colours

    shown = [p for p in projected if p.get("throughput_img_s")]
    if not shown:
        return None
    colours = strategy_colours(rows)
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 5))
    for row in rows:
        if not row.throughput:
            continue
        here = (max(1, row.processes or len(row.devices) or 1), row.throughput)
        points = sorted((p["devices"], p["throughput_img_s"]) for p in shown if p["label"] == row.label)
        colour = colours.get(row.strategy, "black")
        ax.plot([here[0]], [here[1]], color=colour, marker="o", linestyle="-", label=f"{row.label} (measured)")
        if points:
            ax.plot([here[0], *[x for x, _ in points]], [here[1], *[y for _, y in points]], color=colour,
                    linestyle="--", marker="x", alpha=0.8)
    ax.set(xscale="log", yscale="log", xlabel="devices (log)", ylabel="images per second (log)",
           title="Measured here (solid markers) and projected (dashed)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def html_section(projected: Sequence[dict[str, Any]], plot: str) -> str:
    """The page's projection section: the table, its assumptions, the scaling plot (an embedded image)."""
    import html

    head = "".join(f"<th>{h}</th>" for h in ("combination", "hardware", "devices", "global batch", "img/s",
                                             "peak MiB/rank", "fits", "note"))
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            p["label"], p["hardware"], p.get("devices", "—"), p.get("global_batch", "—"),
            _num(p.get("throughput_img_s"), 0), _num(p.get("peak_mib"), 1),
            "—" if p.get("fits") is None else "yes" if p["fits"] else "NO",
            (p["status"] if p["status"] != "predicted" else "") + (": " + p["reason"] if p.get("reason") else "")))
        + "</tr>" for p in projected)
    notes = dict.fromkeys(a for p in projected for a in p.get("assumptions", []))
    items = "".join(f"<li>{html.escape(a)}</li>" for a in notes)
    return ('<section id="projection"><h2>Projected past this machine (weak scaling: each rank keeps its batch)</h2>'
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<p>Assumptions:</p><ul>{items}</ul>" + (f'<div class="figures">{plot}</div>' if plot else "")
            + "</section>")
