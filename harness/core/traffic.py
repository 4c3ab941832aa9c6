"""What a strategy sends and keeps for sending each iteration, declared by the strategy itself
(`Strategy.traffic`), so that predictions (harness.prediction) never ask a strategy's name.

Sizes are named, not counted: the planner knows the model (`grads` = every gradient the model makes, in
the dtype backward leaves it; `params` = every parameter in the dtype the forward uses; `stored_params`
= the parameters the optimizer steps (O2's fp32 masters); `unit_params` /
`unit_grads` = the largest FSDP unit's; `bucket` = one DDP bucket of `bucket_cap_mb`). `dtype` None keeps
the payload's own dtype; a name (`bfloat16`) is what a compression hook sends.

A collective runs over the whole world unless its `group` says otherwise: with replicas of the sharded state
(HSDP, `Traffic.replicate` > 1) the ranks are `replicate` shard groups of world/replicate consecutive ranks each;
`shard` is one of those groups, `replicate` the ranks holding the same shard (one per shard group), which exchange
only that shard: 1/shard of the named payload."""

from __future__ import annotations

from dataclasses import dataclass

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
PAYLOADS = ("grads", "params", "stored_params", "powersgd")
OVERLAPS = ("backward", "forward", "none")  # what the collective can hide under; none: it is waited for
CALLS = ("whole", "per_param")  # one call for the payload (or its buckets and units), or one per parameter
BUFFERS = ("grads", "unit_params", "unit_grads", "bucket", "params")
GROUPS = ("world", "shard", "replicate")  # over which ranks a collective runs (HSDP's two groups)
# how often: once an optimizer step (gradients, which accumulation keeps until the last micro-batch), or once every
# micro-batch (FSDP's parameters, gathered for each micro-batch's forward and backward)
EVERY = ("step", "micro_batch")


@dataclass(frozen=True)
class Collective:
    op: str
    payload: str
    overlap: str
    dtype: str | None = None
    powersgd_rank: int = 0  # payload powersgd: each gradient matrix sent as rank-r factors
    calls: str = "whole"  # per_param: one call per parameter, each paying the latency
    group: str = "world"  # shard | replicate: within one shard group, or across them (HSDP)
    every: str = "step"  # micro_batch: again for each micro-batch of gradient accumulation

    def __post_init__(self) -> None:
        if self.op not in OPS or self.payload not in PAYLOADS or self.overlap not in OVERLAPS or \
                self.calls not in CALLS or self.group not in GROUPS or self.every not in EVERY:
            raise ValueError(f"not a collective the planner knows: {self}")


@dataclass(frozen=True)
class Buffer:
    """Memory a rank holds for communication, beyond the parameters and gradients themselves."""

    size: str  # one of BUFFERS
    copies: float = 1.0
    dtype: str | None = None
    bucket_cap_mb: float = 25.0

    def __post_init__(self) -> None:
        if self.size not in BUFFERS:
            raise ValueError(f"not a buffer the planner knows: {self}")


@dataclass(frozen=True)
class Traffic:
    collectives: tuple[Collective, ...] = ()
    buffers: tuple[Buffer, ...] = ()
    replicas_per_device: bool = False  # DataParallel: a replica of the model on every device it drives
    predictable: bool = True
    why_not: str = ""
    replicate: int = 1  # HSDP: copies of the sharded state, each spread over world/replicate consecutive ranks

    def __post_init__(self) -> None:
        if self.replicate < 1:
            raise ValueError(f"replicate must be at least 1: {self}")

    def sharded_over(self, world_size: int) -> int:
        """The ranks one copy of what the strategy shards is spread over (`StrategySpec.shards` divides by this):
        the world, or one of HSDP's shard groups."""
        return max(1, world_size // self.replicate)
