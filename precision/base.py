"""The hooks the trainer calls; it never asks which level or implementation it is talking to."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from harness.config import PrecisionSpec

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
NO_CONTEXT = contextlib.nullcontext()  # reusable: entered every iteration, so made once


class Precision:
    """fp32 (O0): every hook is the plain PyTorch call."""

    def __init__(self, spec: PrecisionSpec, device: torch.device) -> None:
        self.spec, self.device = spec, device

    @staticmethod
    def unavailable_reason(spec: PrecisionSpec, accelerator: str) -> str | None:
        return None

    @staticmethod
    def skip_reason(spec: PrecisionSpec, accelerator: str) -> str | None:
        """Why this level has nothing meaningful to measure on this machine (recorded as `skipped`)."""
        return None

    def prepare(self, model: nn.Module, make_optimizer: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Cast the model and build its optimizer; runs before the strategy wraps the model."""
        return model, make_optimizer(model.parameters())

    def wrap_module(self, model: nn.Module) -> nn.Module:
        """Casting that must happen inside forward (so it reaches DataParallel's replica threads)."""
        return model

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return NO_CONTEXT

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Gradients dropped (not zeroed in place): no memset per step, as `torch.optim` defaults to."""
        optimizer.zero_grad(set_to_none=True)

    def state(self) -> dict[str, Any]:
        """Loss-scale bookkeeping for the results; read once after the timed loop (it may sync)."""
        return {"final_loss_scale": 1.0, "skipped_steps": 0}


def _implementation(spec: PrecisionSpec) -> type[Precision]:
    if spec.impl == "apex":
        from precision.apex_amp import ApexPrecision

        return ApexPrecision
    from precision.native import NativePrecision

    return NativePrecision if spec.level != "O0" else Precision


def build_precision(spec: PrecisionSpec, device: torch.device) -> Precision:
    return _implementation(spec)(spec, device)


def precision_unavailable_reason(spec: PrecisionSpec, accelerator: str) -> str | None:
    return _implementation(spec).unavailable_reason(spec, accelerator)


def precision_skip_reason(spec: PrecisionSpec, accelerator: str) -> str | None:
    return _implementation(spec).skip_reason(spec, accelerator)
