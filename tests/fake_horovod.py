"""A stand-in for horovod 0.28.1's `horovod.torch`, in one process that plays rank 0 of 2, reproducing the
bookkeeping of `hvd.DistributedOptimizer` the harness must live with (quoted from horovod/torch/optimizer.py
at v0.28.1, class `_DistributedOptimizer`):

- each parameter's gradient hook counts backward passes down from `backward_passes_per_step` and starts the
  allreduce at zero; one more backward before step()/synchronize() raises (`_make_hook`: `if
  self._allreduce_delay[p] <= 0: raise AssertionError("Gradients were computed more than "
  "backward_passes_per_step times before call to step()...")`);
- `zero_grad` raises while an allreduce is pending (`if self._handles: raise AssertionError("optimizer.zero_grad()
  was called after loss.backward() but before optimizer.step() or optimizer.synchronize()...")`);
- `synchronize()` starts the allreduce of every parameter no hook has reduced (reading its `.grad`), waits
  for them all, rearms the counts (`self._allreduce_delay[p] = self.backward_passes_per_step`)
  and sets `_synchronized`; `step()` then warns ("optimizer.step() called without optimizer.skip_synchronize()
  context after optimizer.synchronize()...") and synchronizes.

The allreduce averages identical gradients (both ranks are this process): it leaves them as they are, and is
recorded in `ALLREDUCES` (the parameter's name) so that tests can count them.
"""

from __future__ import annotations

import contextlib
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

ALLREDUCES: list[str] = []


class _DistributedOptimizer:
    """Mixed into the wrapped optimizer's class, as horovod does (`type(optimizer.__class__.__name__,
    (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))`)."""

    def __init__(self, params: Any, named_parameters: Any, compression: Any, backward_passes_per_step: int = 1) -> None:
        super(self.__class__, self).__init__(params)  # type: ignore[misc]
        named = list(named_parameters) if named_parameters is not None else [
            (f"allreduce.noname.{i}", p) for group in self.param_groups for i, p in enumerate(group["params"])]
        self._parameter_names = {p: n for n, p in named}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for _, p in named}
        self._handles: dict[torch.Tensor, Any] = {}
        self._synchronized = False
        self._should_synchronize = True
        self._requires_update: set[torch.Tensor] = set()
        for group in self.param_groups:  # `if size() > 1 ...: self._register_hooks()`
            for p in group["params"]:
                if p.requires_grad:  # horovod hooks the gradient accumulator: after p.grad is updated
                    self._requires_update.add(p)
                    p.register_post_accumulate_grad_hook(self._make_hook(p))

    def _make_hook(self, p: torch.Tensor) -> Any:
        def hook(*ignore: Any) -> None:
            if p in self._handles and self._handles[p] is not None and self._allreduce_delay[p] <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before "
                                     "call to step(). Increase backward_passes_per_step to accumulate gradients "
                                     "locally.")
            self._allreduce_delay[p] -= 1
            handle = None
            if self._allreduce_delay[p] == 0:
                ALLREDUCES.append(self._parameter_names[p])
                handle = p.grad
            self._handles[p] = handle
        return hook

    def synchronize(self) -> None:
        # every parameter no hook has reduced is reduced now, its gradient read whether it has one or not
        # (`missing_p = self._requires_update - completed`, then `_allreduce_grad_async(p)`, whose first line is
        # `if p.grad.is_sparse:`: an AttributeError for a parameter without a gradient)
        for p in self._requires_update:
            if self._handles.get(p) is None:
                p.grad.is_sparse  # noqa: B018 (horovod's access, and its failure on None)
                ALLREDUCES.append(self._parameter_names[p])
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)  # type: ignore[misc]

    def zero_grad(self) -> None:
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                                 "cause a race condition.")
        return super(self.__class__, self).zero_grad()  # type: ignore[misc]


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,  # noqa: N802 (horovod's)
                         compression: Any = None, backward_passes_per_step: int = 1) -> torch.optim.Optimizer:
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)


def install(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """`import horovod.torch as hvd` finds this module's stand-in for the test's duration."""
    ALLREDUCES.clear()
    hvd = types.ModuleType("horovod.torch")
    hvd.DistributedOptimizer = DistributedOptimizer  # type: ignore[attr-defined]
    hvd.Compression = types.SimpleNamespace(none="none", fp16="fp16")  # type: ignore[attr-defined]
    hvd.broadcast_parameters = lambda state, root_rank: None  # type: ignore[attr-defined]
    hvd.broadcast_optimizer_state = lambda optimizer, root_rank: None  # type: ignore[attr-defined]
    hvd.size = lambda: 2  # type: ignore[attr-defined]
    package = types.ModuleType("horovod")
    package.torch = hvd  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "horovod", package)
    monkeypatch.setitem(sys.modules, "horovod.torch", hvd)
    return hvd
