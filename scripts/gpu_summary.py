"""gpu-check.md from the GPU suite's JUnit XML: the machine, each test's outcome, and the figures it recorded.

    python scripts/gpu_summary.py JUNIT_XML OUT_MD
"""

from __future__ import annotations

import datetime as dt
import platform
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def machine() -> dict[str, str]:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "CUDA (torch build)": str(torch.version.cuda), "GPUs": "none"}
    if torch.cuda.is_available():
        info["GPUs"] = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        info["NCCL"] = ".".join(map(str, torch.cuda.nccl.version()))
    try:
        import pynvml

        pynvml.nvmlInit()
        info["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        info["NVML activity (GPU 0)"] = nvml_activity(pynvml)
        pynvml.nvmlShutdown()
    except Exception as error:  # the summary says what it could not read
        info["driver"] = f"unknown ({error})"
    try:
        import apex.amp  # noqa: F401

        info["NVIDIA apex"] = "installed (amp present)"
    except ImportError as error:
        info["NVIDIA apex"] = f"not available ({error})"
    return info


def nvml_activity(pynvml: Any) -> str:
    """Which of the activity queries the harness samples this GPU answers (the rest are recorded as unavailable)."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    queries = {"utilisation": lambda: f"{pynvml.nvmlDeviceGetUtilizationRates(handle).gpu} %",
               "SM clock": lambda: f"{pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)} MHz",
               "power": lambda: f"{pynvml.nvmlDeviceGetPowerUsage(handle) / 1000:.0f} W",
               "energy counter": lambda: f"{pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000:.0f} J"}
    parts = []
    for name, query in queries.items():
        try:
            parts.append(f"{name} {query()}")
        except pynvml.NVMLError as error:
            parts.append(f"{name} unavailable ({error})")
    return ", ".join(parts)


def outcomes(junit: Path) -> list[dict[str, Any]]:
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, detail = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                detail = (node.get("message") or node.text or "").strip().splitlines()[0][:300]
        figures = {p.get("name"): p.get("value") for p in case.iter("property")}
        rows.append({"test": case.get("name"), "outcome": outcome, "seconds": float(case.get("time") or 0),
                     "figures": figures, "detail": detail})
    return rows


def to_markdown(rows: list[dict[str, Any]], info: dict[str, str], commit: str) -> str:
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failed", "error", "skipped")}
    lines = ["# GPU check", "", f"{dt.datetime.now():%Y-%m-%d %H:%M}, harness commit {commit}", "",
             "| machine | |", "|---|---|", *[f"| {k} | {v} |" for k, v in info.items()], "",
             "**" + ", ".join(f"{n} {k}" for k, n in counts.items()) + "**", "",
             "| test | outcome | s | figures / reason |", "|---|---|---:|---|"]
    for r in rows:
        figures = "; ".join(f"{k} = {v}" for k, v in r["figures"].items())
        text = "; ".join(t for t in (figures, r["detail"]) if t).replace("|", "/")
        lines.append(f"| {r['test']} | {r['outcome']} | {r['seconds']:.1f} | {text} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    junit, out = Path(argv[0]), Path(argv[1])
    commit = argv[2] if len(argv) > 2 else "unknown"
    out.write_text(to_markdown(outcomes(junit), machine(), commit))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
