"""The hooks the trainer calls on an amp plugin; it never asks which level or implementation it talks to."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from harness.core.amp_levels import AmpSpec

NO_CONTEXT = contextlib.nullcontext()  # reusable: entered every iteration, so made once


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer the config names (`optim`: its class and keywords). Strategies build it in one place
    (`Strategy.build_optimizer`), and one that shards it (ZeRO) hands the class and keywords on as they are."""

    cls: type[torch.optim.Optimizer]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, optim: Mapping[str, Any]) -> OptimizerSpec:
        """`conf/optim/*.yaml`: `_target_` the class, the rest its keywords (`_partial_` aside)."""
        from hydra.utils import get_class

        return cls(get_class(str(optim["_target_"])), {k: v for k, v in optim.items() if not k.startswith("_")})

    def build(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return self.cls(params, **self.kwargs)


@dataclass(frozen=True)
class ShardedPrecision:
    """What a strategy that shards parameters (FSDP2) does in place of the plugin's casting: whether the model
    is cast first, the dtypes its units gather, reduce and return in (FSDP2's MixedPrecisionPolicy), and
    whether batch-norm layers are units of their own, kept fp32."""

    cast_model: bool = False
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    norms_apart: bool = False


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

    def kernels(self) -> contextlib.AbstractContextManager[Any]:
        """Held over the whole run (set-up, compile, timed loop): which kernels the level's ops take, where the
        plugin chooses (NativeAmp on a CPU taken as emulating half types); nothing by default."""
        return NO_CONTEXT

    # ---- set-up, in the order Strategy.setup_module calls them ----

    def cast_module(self, model: nn.Module) -> nn.Module:
        """The precision phase: the model cast as the level says (before any wrapper sees its parameters)."""
        return model

    def optimizer_params(self, model: nn.Module) -> Iterable[nn.Parameter]:
        """The parameters the optimizer steps: the model's, or fp32 master copies the plugin keeps."""
        return model.parameters()

    def connect(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model and its optimizer, once both exist and before any wrapper (apex's amp.initialize)."""
        return model, optimizer

    def sharded_precision(self, reduce_dtype: torch.dtype | None, model: nn.Module | None = None) -> ShardedPrecision:
        """This level for a strategy that shards parameters (FSDP2) and `model`: fp32, gradients reduced in
        `reduce_dtype` (the strategy's compression, or None)."""
        return ShardedPrecision(reduce_dtype=reduce_dtype)

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
