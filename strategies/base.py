"""What the trainer and launcher ask of a strategy. Class attributes say how processes are laid out,
so the parent can place and validate a run without building anything."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn

from harness.config import PrecisionSpec
from harness.devices import DeviceOps, Placement


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

    def __init__(self, name: str) -> None:
        self.name = name
        self.ops: DeviceOps | None = None

    @classmethod
    def skip_reason(cls, placement: Placement, precision: PrecisionSpec) -> str | None:
        """Why this strategy has nothing to measure on this placement (recorded as `skipped`)."""
        if cls.needs_cuda and placement.accelerator != "cuda":
            return "needs CUDA GPUs; this machine has none (ran nothing)"
        return None

    @classmethod
    def check_compatible(cls, placement: Placement, precision: PrecisionSpec) -> None:
        """Raise Incompatible for a precision this strategy would run wrongly (checked before launch)."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """A missing optional package: an error for a single run, a `skipped` row in a sweep."""
        return None

    def setup(self, env: RankEnv) -> None:
        placement = env.placement
        if self.one_process_per_device:
            indices = placement.torch_indices[env.local_rank:env.local_rank + 1]
            labels: tuple[str, ...] = (placement.rank_device(env.local_rank),)
        else:
            indices, labels = placement.torch_indices, placement.devices
        self.ops = DeviceOps(placement.accelerator, indices, labels)

    @property
    def device(self) -> torch.device:
        assert self.ops is not None, "setup() first"
        return self.ops.device

    def convert_module(self, model: nn.Module) -> nn.Module:
        """Layer swaps needed before precision set-up (e.g. synchronized batch-norm)."""
        return model

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def synchronize(self) -> None:
        assert self.ops is not None
        self.ops.synchronize()

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
        assert self.ops is not None
        device_id = self.ops.device if self.ops.accelerator == "cuda" else None
        dist.init_process_group(self.ops.dist_backend, rank=env.rank, world_size=env.world_size,
                                timeout=timedelta(seconds=env.timeout_s), device_id=device_id)

    def barrier(self) -> None:
        assert self.ops is not None
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
