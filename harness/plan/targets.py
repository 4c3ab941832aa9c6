"""Where a prediction is made for: this machine (its measured preset, `local`) or a named preset."""

from __future__ import annotations

from collections.abc import Callable

import psutil
import torch

from harness.plan.hardware import GIB, LOCAL, load_preset, measure_machine
from harness.plan.links import Link
from harness.plan.predict import Target


def local_memory_gib(accelerator: str) -> float:
    """Each GPU's total memory through NVML (the parent creates no CUDA context), or the RAM."""
    if accelerator == "cuda":
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total / GIB
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 (no NVML: torch's figure, at the cost of initialising CUDA here)
            return torch.cuda.get_device_properties(0).total_memory / GIB
    return psutil.virtual_memory().total / GIB


def local_target(accelerator: str, devices: int, threads: int,
                 measure_link: Callable[[], tuple[Link, dict[str, Link]]] | None = None) -> Target:
    """This machine for a run of `devices` ranks (processes on CPU) at `threads` threads each; the link is read
    from the cache, or measured by `measure_link` when given."""
    machine = measure_machine(threads, accelerator, devices, measure_link, local_memory_gib(accelerator))
    preset = load_preset(LOCAL, machine=machine)
    return Target(preset, threads, link_measured=devices <= 1 or machine["link_measured"])


def preset_target(name: str, threads: int) -> Target:
    """A named preset: its compute comes from the step's operators (harness.plan.gpu_model), nothing measured
    here."""
    return Target(load_preset(name), threads)
