"""PyTorch Ignite's `ignite.distributed` (idist), fitted to the harness's launch model.

`idist.Parallel(backend, nproc_per_node=N)` would spawn its own workers; here the harness's elastic
launcher starts one worker per device instead (as for DDP), so the parent samples every worker's
memory and PID and the common trainer loop runs unchanged. Inside each worker Ignite takes over the
torchrun-style environment the launcher set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT):
`setup` calls `idist.initialize(backend)` and `teardown` `idist.finalize()`, which is what
`with idist.Parallel(backend=...)` does under torchrun, plus the harness's collective timeout
(Parallel does not pass one on). The model is wrapped by `idist.auto_model` (DDP when the world has
more than one process), the optimizer by `idist.auto_optim`, and the data goes to `idist.device()`.

Ignite's backends (`strategy.backend`): gloo and nccl (auto picks by device); horovod, joined as
strategy=horovod joins it (strategies/horovod.py); mpi and xla-tpu are refused with the reason found on
this machine's packages.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from amp import AmpSpec
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.errors import Incompatible
from harness.core.optional import package_missing
from harness.core.traffic import Buffer, Collective, Traffic
from strategies import horovod
from strategies.base import RankEnv, Strategy, check_backend
from strategies.capabilities import GradientSyncControl

INSTALL_HINT = "strategy=ignite needs pytorch-ignite: pip install -e '.[ignite]'"


def _idist() -> Any:
    import ignite.distributed as idist  # optional extra: imported only by runs that use it

    return idist


class IgniteStrategy(GradientSyncControl, Strategy):
    one_process_per_device = True

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """idist.auto_model wraps the model in torch DDP (default options) when there are several processes."""
        return Traffic((Collective("all_reduce", "grads", "backward"),), (Buffer("grads"),))

    def __init__(self, sync_bn: bool = False, find_unused_parameters: bool = False,
                 backend: Literal["auto", "gloo", "nccl", "mpi", "horovod", "xla-tpu"] = "auto") -> None:
        super().__init__()
        self.sync_bn, self.find_unused_parameters, self.backend = sync_bn, find_unused_parameters, backend
        self._device: torch.device | None = None
        self._grad_accum = 1

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return package_missing("ignite", INSTALL_HINT)

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        backend = str(cls.options_of(cfg.strategy)["backend"])
        if backend == "xla-tpu":
            raise Incompatible("strategy.backend", backend, xla_tpu_refusal())
        if backend == "horovod":  # auto_optim wraps the optimizer in horovod's DistributedOptimizer: its refusals
            horovod.HorovodStrategy.check_compatible(placement, amp)
            missing = horovod.HorovodStrategy.unavailable_reason()
            if missing:
                raise Incompatible("strategy.backend", backend, f"auto, gloo or nccl here: {missing}")
            return
        check_backend(backend, placement.accelerator)

    def setup(self, env: RankEnv) -> None:
        if env.placement.accelerator == "cpu":
            # idist.device() is a GPU whenever one is visible, gloo or not: a CPU run (gpus=[] on a GPU
            # machine) hides them from this worker before anything initialises CUDA.
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        super().setup(env)  # the device, chosen as for DDP (local rank r drives visible GPU r)
        self._grad_accum = env.grad_accum
        idist, timeout = _idist(), timedelta(seconds=env.timeout_s)
        if self.backend == "horovod":  # the harness's own group carries the rendezvous port, then horovod
            dist.init_process_group(self.ops.dist_backend, rank=env.rank, world_size=env.world_size, timeout=timeout)
            horovod.join_horovod(env)
            idist.initialize("horovod")
        else:
            idist.initialize(self.ops.dist_backend if self.backend == "auto" else self.backend, timeout=timeout)
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

    def wrap_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """auto_optim: horovod's DistributedOptimizer, told the micro-batches per step (as strategy=horovod
        does); the optimizer as it is for gloo/nccl."""
        if self.backend == "horovod":
            return _idist().auto_optim(optimizer, backward_passes_per_step=self._grad_accum)
        return _idist().auto_optim(optimizer)

    def after_compile_pass(self, optimizer: torch.optim.Optimizer) -> None:
        if self.backend == "horovod":
            horovod.settle_compile_pass(optimizer)

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
        """Through Ignite's own context, whichever backend it joined (its group, or horovod's)."""
        _idist().barrier()

    def max_over_ranks(self, value: float) -> float:
        return float(_idist().all_reduce(value, op="MAX"))

    def teardown(self) -> None:
        if self._device is not None:
            _idist().finalize()
        if dist.is_initialized():  # horovod's control group
            dist.destroy_process_group()
            self._device = None


def xla_tpu_refusal() -> str:
    """Why Ignite's xla-tpu backend cannot run here, from the installed packages."""
    why = ("auto, gloo or nccl: Ignite's xla-tpu backend runs in processes started by torch_xla's own "
           "multiprocessing (xmp.spawn), not by a launcher; strategy=xla times XLA devices instead")
    if package_missing("torch_xla", "missing"):
        return f"{why}; torch_xla is not installed (docs/backends.md: 'Horovod, XLA and MPI')"
    import ignite
    import torch_xla
    import torch_xla.core.xla_model as xm

    if not hasattr(xm, "xrt_world_size"):
        return (f"{why}; and pytorch-ignite {ignite.__version__} calls xm.xrt_world_size() "
                f"(ignite/distributed/comp_models/xla.py), which torch_xla {torch_xla.__version__} no longer has")
    return why
