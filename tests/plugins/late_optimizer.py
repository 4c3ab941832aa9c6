"""A strategy whose wrapper replaces the model's parameters (as FSDP2's fully_shard turns them into
DTensors), so its optimizer must be built after wrapping. It needs nothing from the harness but its own
class and yaml (`_target_: plugins.late_optimizer.LateOptimizer`): tests/test_strategies.py runs it."""

from __future__ import annotations

import torch
from torch import nn

from amp import Amp, AmpSpec
from harness.core.devices import Placement
from harness.core.errors import Incompatible
from strategies.base import OptimizerFactory, Strategy


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


class LateOptimizer(Strategy):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    @classmethod
    def check_compatible(cls, placement: Placement, amp: AmpSpec) -> None:
        if amp.level != "O0":
            raise Incompatible("amp", amp.level, "O0 for this test strategy")

    def setup_module(self, model: nn.Module, amp: Amp,
                     make_optimizer: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        wrapped = Reparametrized(model.to(self.device))
        return wrapped, make_optimizer(wrapped.copies.parameters())  # after wrapping: the copies train


class EarlyOptimizer(LateOptimizer):
    """The same wrapper with the default order (optimizer first): the copies never train."""

    def setup_module(self, model: nn.Module, amp: Amp,
                     make_optimizer: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        model = model.to(self.device)
        optimizer = make_optimizer(model.parameters())
        return Reparametrized(model), optimizer
