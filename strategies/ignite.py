"""PyTorch Ignite's `ignite.distributed` (idist), fitted to the harness's launch model.

`idist.Parallel(backend, nproc_per_node=N)` would spawn its own workers; here the harness's elastic
launcher starts one worker per device instead (as for DDP), so the parent samples every worker's
memory and PID and the common trainer loop runs unchanged. Inside each worker Ignite takes over the
torchrun-style environment the launcher set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT):
`setup` calls `idist.initialize(backend)` and `teardown` `idist.finalize()`, which is what
`with idist.Parallel(backend=...)` does under torchrun, plus the harness's collective timeout
(Parallel does not pass one on). The model is wrapped by `idist.auto_model` (DDP when the world has
more than one process) and the data goes to `idist.device()`.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from harness.optional import package_missing
from strategies.base import RankEnv, Strategy

INSTALL_HINT = "strategy=ignite needs pytorch-ignite: pip install -e '.[ignite]'"


def _idist() -> Any:
    import ignite.distributed as idist  # optional extra: imported only by runs that use it

    return idist


class IgniteStrategy(Strategy):
    one_process_per_device = True

    def __init__(self, sync_bn: bool = False, find_unused_parameters: bool = False) -> None:
        super().__init__()
        self.sync_bn, self.find_unused_parameters = sync_bn, find_unused_parameters
        self._device: torch.device | None = None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return package_missing("ignite", INSTALL_HINT)

    def setup(self, env: RankEnv) -> None:
        if env.placement.accelerator == "cpu":
            # idist.device() is a GPU whenever one is visible, gloo or not: a CPU run (gpus=[] on a GPU
            # machine) hides them from this worker before anything initialises CUDA.
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        super().setup(env)  # the device, chosen as for DDP (local rank r drives visible GPU r)
        idist = _idist()
        idist.initialize(self.ops.dist_backend, timeout=timedelta(seconds=env.timeout_s))
        self._device = idist.device()
        if self._device != self.ops.device:  # Ignite drives visible GPU <local rank>, whatever `gpus` says
            raise RuntimeError(f"ignite put local rank {env.local_rank} on {self._device}, the harness on "
                               f"{self.ops.device}: let CUDA_VISIBLE_DEVICES hold exactly the chosen GPUs")

    @property
    def device(self) -> torch.device:
        """Ignite's own idea of this rank's device: the batch and the model go there."""
        if self._device is None:
            raise RuntimeError("IgniteStrategy.setup() has not run")
        return self._device

    def wrap(self, model: nn.Module) -> nn.Module:
        kwargs: dict[str, Any] = {}
        if _idist().get_world_size() > 1:  # DDP's options; auto_model returns a lone process's model as is
            kwargs["find_unused_parameters"] = self.find_unused_parameters
        return _idist().auto_model(model, sync_bn=self.sync_bn, **kwargs)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """auto_model's DDP has no_sync; a lone process's plain model has nothing to skip."""
        sync = getattr(model, "no_sync", None)
        return sync() if callable(sync) else contextlib.nullcontext()

    def barrier(self) -> None:
        _idist().barrier()

    def max_over_ranks(self, value: float) -> float:
        return float(_idist().all_reduce(value, op="MAX"))

    def teardown(self) -> None:
        if self._device is not None:
            _idist().finalize()
            self._device = None
