"""PyTorch/XLA (torch_xla): the model traced lazily and compiled by XLA; data-parallel over several XLA
devices by SPMD.

torch_xla is published only for its own torch version (torch_xla 2.9.0 needs torch 2.9.0), so it lives in
an environment of its own (docs/backends.md: "Horovod, XLA and MPI"); without it the run is skipped with that reason.

One process drives every XLA device, as XLA's SPMD mode intends: parameters are replicated, the batch is
split along its first dimension (`mark_sharding` on the model's input) and the compiler inserts the
gradient all-reduce. On the CPU, `devices` virtual XLA devices come from the PJRT CPU client
(CPU_NUM_DEVICES). The other ways tried here fail on CPU with torch_xla 2.9.0: one process per device under
xmp.spawn stops in XLA's all-reduce rendezvous ("Expected 2 threads to join the rendezvous, but only 1 of
them arrived"), and the cross-process `xla` process-group backend needs a TPU/GPU runtime.

Timing: lazy tensors record the step and `torch_xla.sync()` after every optimizer step (an optimizer
step hook) cuts and runs the graph, which is XLA's method; the window clock waits for the device
(`wait_device_ops`) at window edges only. Graphs are compiled on first use, in the warm-up window; the
compile time XLA measured is reported on its own (`compile_seconds`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from amp import AmpSpec
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.errors import ConfigError
from harness.core.optional import package_missing
from harness.core.traffic import Traffic
from strategies.base import AmpRule, RankEnv, SingleProcessStrategy
from strategies.capabilities import CompilesInWindows

INSTALL_HINT = ("strategy=xla needs torch_xla, which is built for one torch version: in a second environment, "
                "pip install torch==2.9.0 torchvision==0.24.0 torch_xla==2.9.0, then pip install -e . "
                "(docs/backends.md: 'Horovod, XLA and MPI')")


class ShardedInput(nn.Module):
    """Splits each batch across the mesh's devices along its first dimension (SPMD data parallelism)."""

    def __init__(self, module: nn.Module, mesh: Any) -> None:
        super().__init__()
        self.module, self.mesh = module, mesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch_xla.distributed.spmd as xs

        xs.mark_sharding(x, self.mesh, ("data",) + (None,) * (x.dim() - 1))
        return self.module(x)


class XlaStrategy(CompilesInWindows, SingleProcessStrategy):
    amp_rules = (
        AmpRule({"impl": "apex", "level": ("O1", "O2", "O3")}, "impl", "native with strategy=xla (apex amp is "
                "CUDA-only)"),
        AmpRule({"loss_scale": "dynamic"}, "loss_scale", "a fixed scale or amp.dtype=bfloat16 with strategy=xla "
                "(torch.amp's GradScaler reads inf checks on the host every step: a graph break)"),
    )

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        return Traffic(predictable=False, why_not="strategy=xla: XLA compiles and fuses the step as a whole; the "
                       "planner has no model of its graphs")

    def __init__(self, devices: int = 1) -> None:
        super().__init__()
        self.devices = devices
        self._xla_device: torch.device | None = None
        self._mesh: Any = None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return package_missing("torch_xla", INSTALL_HINT)

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        devices = cls.options_of(cfg.strategy)["devices"]
        if devices < 1:
            raise ConfigError("strategy.devices", devices, "an integer >= 1 (XLA devices; on the CPU, virtual ones)")

    def setup(self, env: RankEnv) -> None:
        super().setup(env)
        os.environ.setdefault("PJRT_DEVICE", "CPU" if env.placement.accelerator == "cpu" else "CUDA")
        if os.environ["PJRT_DEVICE"] == "CPU":
            os.environ["CPU_NUM_DEVICES"] = str(self.devices)
        import torch_xla
        import torch_xla.runtime as xr

        if self.devices > 1:
            import numpy as np
            import torch_xla.distributed.spmd as xs

            xr.use_spmd()  # before any XLA tensor exists
            found = xr.global_runtime_device_count()
            if found != self.devices:
                raise RuntimeError(f"strategy.devices={self.devices}, but XLA has {found} devices "
                                   f"(PJRT_DEVICE={os.environ['PJRT_DEVICE']})")
            self._mesh = xs.Mesh(np.arange(found), (found,), ("data",))
        self._xla_device = torch_xla.device()

    @property
    def device(self) -> torch.device:
        if self._xla_device is None:
            raise RuntimeError("XlaStrategy.setup() has not run")
        return self._xla_device

    def wrap_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        import torch_xla

        optimizer.register_step_post_hook(lambda *args: torch_xla.sync())  # one graph per training step
        return optimizer

    def wrap(self, model: nn.Module) -> nn.Module:
        return ShardedInput(model, self._mesh) if self._mesh is not None else model

    def synchronize(self) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()
        xm.wait_device_ops()

    def compile_seconds(self) -> float | None:
        import torch_xla.debug.metrics as met

        data = met.metric_data("CompileTime")  # (count, total ns, samples), None before any compile
        return data[1] / 1e9 if data else 0.0
