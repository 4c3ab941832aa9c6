"""What the worker and the launcher ask of a strategy. Class attributes say how processes are laid out,
so the parent can place and validate a run without building anything; `setup_module` owns the order in
which the model is converted, moved, cast, sharded, given its optimizer and wrapped."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from amp import Amp, AmpSpec, OptimizerSpec
from harness.core.config import RunConfig
from harness.core.devices import DeviceOps, Placement
from harness.core.errors import Incompatible
from harness.core.traffic import Traffic
from strategies.spec import AmpRule, StrategySpec

__all__ = ["AmpRule", "Backend", "BareProcessGroup", "ProcessGroupStrategy", "RankEnv", "SingleProcessStrategy",
           "Strategy", "StrategySpec", "check_backend", "unwrap"]


@dataclass(frozen=True)
class RankEnv:
    rank: int
    local_rank: int
    world_size: int
    placement: Placement
    timeout_s: float
    grad_accum: int = 1  # micro-batches per optimizer step (cfg.grad_accum): horovod's optimizer counts them


class Strategy(StrategySpec, ABC):
    """A strategy in its rank: how its processes and devices are set up and the phases that build the model it
    trains (`setup_module`). Required of every strategy (abstract, so a class that forgets one cannot be built):
    its wrapper (`wrap`, which may be none, said so), parent side what it sends (`traffic`), and how its ranks
    line up and agree (`barrier`, `max_over_ranks`): a default there would let a multi-process strategy time one
    rank instead of the slowest. Subclass `ProcessGroupStrategy` (one process per device, torch.distributed) or
    `SingleProcessStrategy` (one process), which answer those two. Optional capabilities are mixins
    (strategies.capabilities), listed before the base class: gradient sync control for grad_accum, sharded
    parameters, graphs compiled inside the windows."""

    def __init__(self) -> None:
        self._ops: DeviceOps | None = None

    # ---- in every rank ----

    def setup(self, env: RankEnv) -> None:
        placement = env.placement
        if self.one_process_per_device:
            indices = placement.torch_indices[env.local_rank:env.local_rank + 1]
            labels: tuple[str, ...] = (placement.rank_device(env.local_rank),)
        else:
            indices, labels = placement.torch_indices, placement.devices
        self._ops = DeviceOps(placement.accelerator, indices, labels)

    @property
    def ops(self) -> DeviceOps:
        if self._ops is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not run")
        return self._ops

    @property
    def is_set_up(self) -> bool:
        return self._ops is not None

    @property
    def device(self) -> torch.device:
        return self.ops.device

    def setup_module(self, model: nn.Module, amp: Amp,
                     optimizer: OptimizerSpec) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model as it will train, and its optimizer, in phases whose order no strategy changes (a strategy
        overrides the phases it does differently): layer swaps, onto the device, the amp plugin's casting,
        parameters replaced by shards (FSDP2), the optimizer (built here only, over the parameters the amp
        plugin steps, then joined to the plugin: apex's amp.initialize must precede any parallel wrapper),
        the wrapper (DDP, DataParallel, ...) and whatever the strategy wraps the optimizer in. `compile` comes
        last, called by the worker, which times it apart."""
        model = self.place(self.convert_module(model))
        model = self.apply_precision(model, amp)
        model = self.shard(model, amp)
        model, built = amp.connect(model, self.build_optimizer(amp.optimizer_params(model), optimizer))
        model = self.wrap(amp.wrap_module(model))
        return model, self.wrap_optimizer(model, built)

    def convert_module(self, model: nn.Module) -> nn.Module:
        """Layer swaps needed before the amp plugin casts the model (e.g. synchronized batch-norm)."""
        return model

    def place(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def apply_precision(self, model: nn.Module, amp: Amp) -> nn.Module:
        """The amp plugin casts the model (and makes the fp32 masters it steps, at O2)."""
        return amp.cast_module(model)

    def shard(self, model: nn.Module, amp: Amp) -> nn.Module:
        """Parameters replaced by the strategy's own (FSDP2's DTensor shards): before the optimizer is built,
        so that it steps those."""
        return model

    def build_optimizer(self, params: Iterable[nn.Parameter], optimizer: OptimizerSpec) -> torch.optim.Optimizer:
        """The one place an optimizer is built: the configured class over `params` (ZeRO shards it)."""
        return optimizer.build(params)

    @abstractmethod
    def wrap(self, model: nn.Module) -> nn.Module:
        """The parallel wrapper, around parameters that stay as they are (DDP, DataParallel, ...); a strategy
        without one returns the model and says why."""

    def wrap_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer as the strategy steps it (horovod's DistributedOptimizer, ignite's auto_optim)."""
        return optimizer

    def compile(self, model: nn.Module) -> nn.Module:
        """compile=true: the wrapped model compiled (DDP's graph is split at its buckets by dynamo's
        DDPOptimizer; FSDP2's hooks are traced). Compilation itself happens at the first call."""
        return torch.compile(model)

    def after_compile_pass(self, optimizer: torch.optim.Optimizer) -> None:
        """compile=true: called after the compile pass's backward, before its gradients are dropped, to undo
        what that extra backward did to the strategy's own state, so the timed run starts as an uncompiled
        one would (e.g. a communication hook's iteration count, gradients a wrapped optimizer still awaits)."""

    def synchronize(self) -> None:
        self.ops.synchronize()

    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The trained parameters as one device would hold them, by the unwrapped model's names, on the CPU
        in float32: what numerical parity compares across strategies and between replicas. A strategy that
        shards parameters overrides this to gather them first (every rank must call it)."""
        return {name: p.detach().float().cpu().clone() for name, p in unwrap(model).named_parameters()}

    @abstractmethod
    def barrier(self) -> None:
        """Required: every rank waits here for the others (the worker lines them up before the clock starts)."""

    @abstractmethod
    def max_over_ranks(self, value: float) -> float:
        """Required: the largest `value` any rank holds, on every rank (iterations=auto decides on the slowest
        rank's clock)."""

    def teardown(self) -> None:
        """Undo what `setup` started (a process group); nothing by default."""


Backend = Literal["auto", "gloo", "nccl", "mpi"]


def check_backend(backend: str, accelerator: str) -> None:
    """The torch.distributed backend a run asks for (`strategy.backend`), refused here when it cannot work:
    nccl needs GPUs; mpi needs a torch built from source with MPI (the published wheels are not:
    `torch.distributed.is_mpi_available()` is False) and processes started by `mpirun`, which assigns the
    ranks (init_process_group("mpi") ignores the launcher's RANK/WORLD_SIZE)."""
    if backend == "nccl" and accelerator != "cuda":
        raise Incompatible("strategy.backend", backend, "auto or gloo on the CPU: nccl runs only on CUDA GPUs")
    if backend == "mpi":
        if not dist.is_mpi_available():
            raise Incompatible("strategy.backend", backend, f"auto, gloo or nccl: this torch ({torch.__version__}) "
                               "was built without MPI (torch.distributed.is_mpi_available() is False, as for every "
                               "published wheel; MPI needs torch built from source against an MPI library)")
        raise Incompatible("strategy.backend", backend, "auto, gloo or nccl: this torch has MPI, but MPI ranks are "
                           "assigned by mpirun and the harness starts its workers itself (not wired yet)")


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside its wrappers: torch.compile's OptimizedModule keeps it as `_orig_mod`;
    DDP, DataParallel and the amp plugin's CastingModule as `module`."""
    inner = getattr(model, "_orig_mod", model)
    while isinstance(getattr(inner, "module", None), nn.Module):
        inner = inner.module
    return inner


class SingleProcessStrategy(Strategy):
    """One process, however many devices it drives (single, DataParallel, XLA's SPMD): no other rank to wait
    for, so the barrier is nothing and this process's value is the largest."""

    one_process_per_device = False

    def barrier(self) -> None:
        """No other process to wait for."""

    def max_over_ranks(self, value: float) -> float:
        """This process's value is every rank's."""
        return value


class ProcessGroupStrategy(Strategy):
    """One process per device joined in a torch.distributed process group (nccl on GPUs, gloo on CPU, or
    the subclass's `backend` option)."""

    one_process_per_device = True
    backend: str = "auto"

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        check_backend(str(cls.options_of(cfg.strategy).get("backend", cls.backend)), placement.accelerator)  # fsdp: none

    @property
    def backend_name(self) -> str:
        return self.ops.dist_backend if self.backend == "auto" else self.backend

    def setup(self, env: RankEnv) -> None:
        super().setup(env)
        device_id = self.ops.device if self.ops.accelerator == "cuda" else None
        if dist.is_initialized():  # the planner's calibration of one rank of a larger group (a fake process group)
            return
        dist.init_process_group(self.backend_name, rank=env.rank, world_size=env.world_size,
                                timeout=timedelta(seconds=env.timeout_s), device_id=device_id)

    def barrier(self) -> None:
        if self.ops.accelerator == "cuda":
            dist.barrier(device_ids=[self.ops.device.index])
        else:
            dist.barrier()

    def max_over_ranks(self, value: float) -> float:
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class BareProcessGroup(ProcessGroupStrategy):
    """The device and process group exactly as DDP gets them, and no model: the collectives benchmark
    (harness.collectives) and the planner's measurement of this machine's link."""

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        return Traffic()

    def wrap(self, model: nn.Module) -> nn.Module:
        return model
