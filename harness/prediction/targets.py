"""Where a prediction is made for: this machine (its measured preset, `local`) or a named preset."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import psutil

from harness.prediction.hardware import GIB, LOCAL, load_preset, measure_machine
from harness.prediction.links import Link
from harness.prediction.predict import Target


def local_memory_gib(accelerator: str) -> float:
    """Each GPU's total memory through NVML, or the RAM. Where NVML fails, torch reads it in a child process:
    asked here, torch would initialise CUDA in the parent, whose context then holds device memory (and forbids
    forked workers) through every run it launches."""
    if accelerator == "cuda":
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total / GIB
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 (no pynvml, no driver library, no permission)
            return _total_memory_in_a_child() / GIB
    return psutil.virtual_memory().total / GIB


def _total_memory_in_a_child() -> int:
    code = "import torch; print(torch.cuda.get_device_properties(0).total_memory)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return int(done.stdout.split()[-1])


def local_target(accelerator: str, devices: int, threads: int,
                 measure_link: Callable[[], tuple[Link, dict[str, Link]]] | None = None) -> Target:
    """This machine for a run of `devices` ranks (processes on CPU) at `threads` threads each; the link is read
    from the cache, or measured by `measure_link` when given."""
    machine = measure_machine(threads, accelerator, devices, measure_link, local_memory_gib(accelerator))
    preset = load_preset(LOCAL, machine=machine)
    return Target(preset, threads, link_measured=devices <= 1 or machine["link_measured"],
                  link_scale=machine["link_scale"])


def preset_target(name: str, threads: int, nodes: int = 0) -> Target:
    """A named preset (`nodes` of its nodes, 0: its own count): its compute comes from the step's operators
    (harness.prediction.gpu_model), nothing measured here."""
    return Target(load_preset(name, nodes=nodes), threads)
