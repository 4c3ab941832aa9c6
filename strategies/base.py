"""What the worker and the launcher ask of a strategy. Class attributes say how processes are laid out,
so the parent can place and validate a run without building anything; `setup_module` owns the order in
which the model is converted, moved, cast, wrapped and given its optimizer."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from amp import Amp, AmpSpec
from harness.rank.devices import DeviceOps, Placement

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class RankEnv:
    rank: int
    local_rank: int
    world_size: int
    placement: Placement
    timeout_s: float


class Strategy:
    one_process_per_device: ClassVar[bool] = False  # True: the launcher starts a worker per device
    drives_all_devices: ClassVar[bool] = False  # True: one process uses every chosen GPU
    needs_cuda: ClassVar[bool] = False

    def __init__(self) -> None:
        self._ops: DeviceOps | None = None

    # ---- decided in the parent, before anything starts ----

    @classmethod
    def skip_reason(cls, placement: Placement, amp: AmpSpec) -> str | None:
        """Why this strategy has nothing to measure on this placement (recorded as `skipped`)."""
        if cls.needs_cuda and placement.accelerator != "cuda":
            return "needs CUDA GPUs; this machine has none (ran nothing)"
        return None

    @classmethod
    def check_compatible(cls, placement: Placement, amp: AmpSpec) -> None:
        """Raise Incompatible for an amp level this strategy would run wrongly."""

    @classmethod
    def check_options(cls, options: Mapping[str, Any], batch_size: int) -> None:
        """Raise ConfigError for an option value its type allows but the run cannot use (a range, a relation
        with the global batch); called with the strategy's config section, before anything starts."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """A missing optional package: an error for a single run, a `skipped` row in a sweep."""
        return None

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
                     make_optimizer: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model as it will train, and its optimizer. The default order: layer swaps, onto the device,
        cast by the amp plugin (which builds the optimizer over the parameters it steps, e.g. O2's fp32
        masters), then wrapped. A strategy that must build the optimizer after wrapping (FSDP's parameters
        become DTensors) overrides this."""
        model = self.convert_module(model).to(self.device)
        model, optimizer = amp.prepare(model, make_optimizer)
        return self.wrap(amp.wrap_module(model)), optimizer

    def convert_module(self, model: nn.Module) -> nn.Module:
        """Layer swaps needed before the amp plugin casts the model (e.g. synchronized batch-norm)."""
        return model

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def synchronize(self) -> None:
        self.ops.synchronize()

    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The trained parameters as one device would hold them, by the unwrapped model's names, on the CPU
        in float32: what numerical parity compares across strategies and between replicas. A strategy that
        shards parameters overrides this to gather them first (every rank must call it)."""
        inner = model
        while isinstance(getattr(inner, "module", None), nn.Module):  # DDP(amp's CastingModule(model)), ...
            inner = inner.module
        return {name: p.detach().float().cpu().clone() for name, p in inner.named_parameters()}

    def barrier(self) -> None:
        """Line ranks up before the clock starts."""

    def max_over_ranks(self, value: float) -> float:
        """The largest `value` any rank holds (iterations=auto decides on the slowest rank's clock)."""
        return value

    def teardown(self) -> None:
        pass


class ProcessGroupStrategy(Strategy):
    """One process per device joined in a torch.distributed process group (nccl on GPUs, gloo on CPU)."""

    one_process_per_device = True

    def setup(self, env: RankEnv) -> None:
        super().setup(env)
        device_id = self.ops.device if self.ops.accelerator == "cuda" else None
        dist.init_process_group(self.ops.dist_backend, rank=env.rank, world_size=env.world_size,
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
