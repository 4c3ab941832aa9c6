"""One device, no wrapper: the baseline.

`batchnorm_shards=N` makes it the numerical-parity reference for a batch-norm model trained by N
data-parallel ranks (or DataParallel replicas): each such rank normalises its own shard of the global batch,
so one device normalising the whole batch computes a legitimately different update. With N shards, every
batch-norm layer normalises N consecutive equal slices of the batch separately, as the ranks do, while the
loss and the step stay those of the whole batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from amp import AmpSpec
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.errors import ConfigError
from harness.core.traffic import Traffic
from strategies.base import SingleProcessStrategy


class ShardedBatchNorm(_BatchNorm):
    """A batch-norm layer that, in training, normalises `shards` consecutive slices of its input with their
    own statistics. Same parameter and buffer names as the layer it replaces (parity compares by name); its
    running statistics take one update per slice, so they differ from any one rank's (buffers, which parity
    does not compare; training-mode outputs never read them)."""

    def __init__(self, norm: _BatchNorm, shards: int) -> None:
        super().__init__(norm.num_features, norm.eps, norm.momentum, norm.affine, norm.track_running_stats)
        self.shards = shards
        self.load_state_dict(norm.state_dict())  # converted before the model moves or is cast

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {input.dim()}-D)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training or self.shards == 1:
            return super().forward(input)
        if input.shape[0] % self.shards:
            raise ValueError(f"a batch of {input.shape[0]} cannot be cut into {self.shards} equal shards")
        return torch.cat([super(ShardedBatchNorm, self).forward(part) for part in input.chunk(self.shards)])


def shard_batchnorm(module: nn.Module, shards: int) -> nn.Module:
    """Every (unsynchronized) batch-norm layer of `module` replaced, in place, by a ShardedBatchNorm."""
    if isinstance(module, _BatchNorm) and not isinstance(module, nn.SyncBatchNorm):
        return ShardedBatchNorm(module, shards)
    for name, child in module.named_children():
        setattr(module, name, shard_batchnorm(child, shards))
    return module


class SingleDevice(SingleProcessStrategy):
    searchable = True  # the baseline: on a CPU, or for a small model, it can be the fastest

    def __init__(self, batchnorm_shards: int = 1) -> None:
        super().__init__()
        self.batchnorm_shards = batchnorm_shards

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        shards, batch_size = cls.options_of(cfg.strategy)["batchnorm_shards"], cfg.batch_size
        if shards < 1 or batch_size % shards:
            raise ConfigError("strategy.batchnorm_shards", shards,
                              f"an integer >= 1 that divides batch_size ({batch_size}) into equal shards")
        micro = batch_size // cfg.grad_accum
        if cfg.grad_accum > 1 and micro % shards:  # each micro-batch is a forward of its own, cut into shards
            raise ConfigError("strategy.batchnorm_shards", shards, f"an integer >= 1 that divides each micro-batch "
                              f"(batch_size {batch_size} / grad_accum {cfg.grad_accum} = {micro}) into equal shards")

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """One device: nothing is sent."""
        return Traffic()

    def convert_module(self, model: nn.Module) -> nn.Module:
        return shard_batchnorm(model, self.batchnorm_shards) if self.batchnorm_shards > 1 else model

    def wrap(self, model: nn.Module) -> nn.Module:
        """No wrapper: the baseline trains the model as it is."""
        return model
