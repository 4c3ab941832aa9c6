"""A stand-in for NVIDIA apex 25.05's `apex.amp`, reproducing the two behaviours the harness must live with
(quoted from apex's source at tag 25.05):

- O0/O2/O3 replace the model's forward by a closure over the original module
  (apex/amp/_initialize.py:196-203: `model.forward = patch_forward(model.forward)`);
- with master weights (O2) the optimizer's zero_grad becomes a method without arguments
  (apex/amp/_process_optimizer.py:367: `def new_zero_grad(self):`, installed at :382).

Loss scaling is a static multiply-and-divide: enough for the trainer's calls, not apex's dynamic scaler.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

CASTS_MODEL = ("O0", "O2", "O3")  # apex's cast_model_type is set for these levels (float32 for O0)


class _Scaler:
    def __init__(self, scale: float) -> None:
        self._scale = scale

    def loss_scale(self) -> float:
        return self._scale


def _initialize(model: nn.Module, optimizer: torch.optim.Optimizer, opt_level: str, loss_scale: Any = None,
                verbosity: int = 1, keep_batchnorm_fp32: Any = None, master_weights: Any = None,
                ) -> tuple[nn.Module, torch.optim.Optimizer]:
    if opt_level in CASTS_MODEL:
        old_forward = model.forward  # bound to *this* module: replicas made from it keep calling it

        def new_forward(*args: Any, **kwargs: Any) -> Any:
            return old_forward(*args, **kwargs)

        model.forward = new_forward
    if master_weights if master_weights is not None else opt_level == "O2":
        def new_zero_grad(self: torch.optim.Optimizer) -> None:
            for group in self.param_groups:
                for param in group["params"]:
                    param.grad = None

        optimizer.zero_grad = types.MethodType(new_zero_grad, optimizer)
    scale = 1.0 if loss_scale in (None, "dynamic") else float(loss_scale)
    amp_state.loss_scalers = [_Scaler(scale)]
    return model, optimizer


@contextlib.contextmanager
def _scale_loss(loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    scale = amp_state.loss_scalers[0].loss_scale()
    yield loss * scale
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                param.grad.div_(scale)


amp_state = types.SimpleNamespace(loss_scalers=[])


@pytest.fixture
def fake_apex(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    apex = types.ModuleType("apex")
    amp = types.ModuleType("apex.amp")
    amp.initialize, amp.scale_loss, amp._amp_state = _initialize, _scale_loss, amp_state
    parallel = types.ModuleType("apex.parallel")
    apex.amp, apex.parallel = amp, parallel
    for name, module in (("apex", apex), ("apex.amp", amp), ("apex.parallel", parallel)):
        monkeypatch.setitem(sys.modules, name, module)
    return apex
