"""The hooks the trainer calls on an amp plugin; it never asks which level or implementation it talks to."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from harness.core.amp_levels import AmpSpec

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
NO_CONTEXT = contextlib.nullcontext()  # reusable: entered every iteration, so made once


class Amp:
    """fp32: every hook is the plain PyTorch call. Implementations override what their levels change."""

    # With master weights: whether the model's own half gradients are still held at the optimizer step, beside
    # the fp32 master gradients it steps with (the memory theory counts both then; native drops them first).
    keeps_model_grads_at_step = False

    def __init__(self, spec: AmpSpec, device: torch.device) -> None:
        self.spec, self.device = spec, device

    @staticmethod
    def unavailable_reason(spec: AmpSpec, accelerator: str) -> str | None:
        return None

    @staticmethod
    def skip_reason(spec: AmpSpec, accelerator: str) -> str | None:
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
        """Gradients dropped, not zeroed in place (no memset per step): torch.optim's default since 2.0.
        Called without arguments: optimizers that wrap another take none (horovod 0.28.1's
        DistributedOptimizer: `def zero_grad(self):`; apex's with master weights: `def new_zero_grad(self):`)."""
        optimizer.zero_grad()

    def state(self) -> dict[str, Any]:
        """Loss-scale bookkeeping for the results; read once after the timed loop (it may sync)."""
        return {"final_loss_scale": 1.0, "skipped_steps": 0}
