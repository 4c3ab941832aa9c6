"""The results file: a stable contract read by the report and by users. Written atomically."""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

SCHEMA = 1
STATUSES = ("ok", "failed", "oom", "skipped", "interrupted")
RESULTS_NAME = "results.json"
PARAMETERS_NAME = "parameters.pt"  # parity=true: rank 0's trained parameters, beside results.json


def write_json_atomic(path: Path, data: Any) -> None:
    """Temp file in the same folder, fsync, rename: a reader sees the old file or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it 0600; results are for others to read too
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, default=str)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(run_dir: Path, results: dict[str, Any]) -> Path:
    """Never over another run's results: a folder holds one run (its own provisional record aside)."""
    path = run_dir / RESULTS_NAME
    if path.exists() and not _is_provisional(path):
        raise FileExistsError(f"{path} already holds a run's results; refusing to overwrite it")
    if results["status"] not in STATUSES:
        raise ValueError(f"status {results['status']!r} is not one of {', '.join(STATUSES)}")
    write_json_atomic(path, results)
    return path


def write_provisional(run_dir: Path, results: dict[str, Any], reason: str) -> Path:
    """A `failed` record written before the run starts, replaced when it ends: if the writer is killed
    without a chance to write (NCCL's watchdog aborting rank 0 after a peer died, the OOM killer), the
    run is still on record, failed, with the likely reasons."""
    return write_results(run_dir, {**results, "status": "failed", "error": reason, "provisional": True})


def _is_provisional(path: Path) -> bool:
    try:
        return bool(load_results(path).get("provisional"))
    except (OSError, ValueError):
        return False


def load_results(path: Path) -> dict[str, Any]:
    with open(path) as handle:
        data = json.load(handle)
    if not isinstance(data, dict) or "schema" not in data or "status" not in data:
        raise ValueError("not a results file (no schema/status)")
    return data


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def harness_commit() -> str | None:
    """The commit the harness runs from (`+changes` when the working tree differs), None outside git."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty else "")


def environment(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch

    from harness.core.devices import cpu_half_reason

    env = {
        "torch": torch.__version__,
        "torch_built_for_cuda": torch.version.cuda,  # the wheel's CUDA version, GPU or not
        "cuda_available": torch.cuda.is_available(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # AVX2, AVX512...: which kernels torch runs
        "cpu_native_half": [d for d in ("bfloat16", "float16") if cpu_half_reason(d) is None],
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "harness_commit": harness_commit(),
        "driver": None,
        "gpu_names": [],
    }
    env.update(extra or {})
    return env
