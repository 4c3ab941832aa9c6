"""The kernel choices of a run (KernelsConfig: cudnn.benchmark, channels_last, float32 matmul precision), set in
the rank before anything is built, and read back from torch for the record: what the run had, not what it asked."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.core.config import KernelsConfig
from harness.core.inputs import Inputs


def apply(kernels: KernelsConfig) -> None:
    torch.backends.cudnn.benchmark = kernels.cudnn_benchmark
    torch.set_float32_matmul_precision(kernels.matmul_precision)


def memory_format(kernels: KernelsConfig, inputs: Inputs) -> torch.memory_format:
    """NHWC for image models when channels_last is on; every other workload keeps its layout."""
    return torch.channels_last if kernels.channels_last and inputs.kind == "images" else torch.contiguous_format


def in_effect(model: nn.Module, accelerator: str) -> dict[str, Any]:
    """What torch has now: the flags, and whether the model's 4-d weights (its convolutions) are NHWC.
    cudnn.benchmark acts on CUDA devices only (torch holds it on a CPU machine too): None where it does not apply."""
    convolutions = [p for p in model.parameters() if p.dim() == 4]
    return {"cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if accelerator == "cuda" else None,
            "matmul_precision": torch.get_float32_matmul_precision(),
            "channels_last": bool(convolutions) and all(p.is_contiguous(memory_format=torch.channels_last)
                                                        for p in convolutions)}
