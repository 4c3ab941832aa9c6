"""A strategy whose wrapper replaces the model's parameters (as FSDP2's fully_shard turns them into
DTensors), so it is done in the `shard` phase, before the base class builds the optimizer. It needs nothing from the harness but its own
class and yaml (`_target_: plugins.late_optimizer.LateOptimizer`): tests/test_strategies.py runs it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from amp import Amp
from harness.core.traffic import Traffic
from strategies.base import AmpRule, SingleProcessStrategy


class Reparametrized(nn.Module):
    """Holds fresh copies of the model's parameters and puts them into the model at every forward: an
    optimizer built over the model's own (original) parameters would step tensors nobody uses."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.names = [name for name, _ in module.named_parameters()]
        self.copies = nn.ParameterList(nn.Parameter(p.detach().clone()) for p in module.parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = dict(zip(self.names, self.copies, strict=True))
        return torch.func.functional_call(self.module, params, (x,))


class LateOptimizer(SingleProcessStrategy):
    """Its wrapper replaces the parameters, so it is the `shard` phase: the base builds the optimizer after."""

    amp_rules = (AmpRule({"level": ("O1", "O2", "O3")}, "level", "O0 for this test strategy"),)

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:  # required: one process sends nothing
        return Traffic()

    def shard(self, model: nn.Module, amp: Amp) -> nn.Module:
        return Reparametrized(model)  # before the optimizer: the copies train

    def wrap(self, model: nn.Module) -> nn.Module:  # required: no wrapper here
        return model


class EarlyOptimizer(LateOptimizer):
    """The same wrapper as a plain `wrap` (after the optimizer is built): the copies never train."""

    def shard(self, model: nn.Module, amp: Amp) -> nn.Module:
        return model

    def wrap(self, model: nn.Module) -> nn.Module:
        return Reparametrized(model)
