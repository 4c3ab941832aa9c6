"""What a strategy sends and keeps for sending each iteration, declared by the strategy itself
(`Strategy.traffic`), so that predictions (harness.plan) never ask a strategy's name.

Sizes are named, not counted: the planner knows the model (`grads` = every gradient the model makes, in
the dtype backward leaves it; `params` = every parameter in the dtype the forward uses; `stored_params`
= the parameters the optimizer steps (O2's fp32 masters); `unit_params` /
`unit_grads` = the largest FSDP unit's; `bucket` = one DDP bucket of `bucket_cap_mb`). `dtype` None keeps
the payload's own dtype; a name (`bfloat16`) is what a compression hook sends."""

from __future__ import annotations

from dataclasses import dataclass

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
PAYLOADS = ("grads", "params", "stored_params", "powersgd")
OVERLAPS = ("backward", "forward", "none")  # what the collective can hide under; none: it is waited for
CALLS = ("whole", "per_param")  # one call for the payload (or its buckets and units), or one per parameter
BUFFERS = ("grads", "unit_params", "unit_grads", "bucket", "params")


@dataclass(frozen=True)
class Collective:
    op: str
    payload: str
    overlap: str
    dtype: str | None = None
    powersgd_rank: int = 0  # payload powersgd: each gradient matrix sent as rank-r factors
    calls: str = "whole"  # per_param: one call per parameter, each paying the latency

    def __post_init__(self) -> None:
        if self.op not in OPS or self.payload not in PAYLOADS or self.overlap not in OVERLAPS or \
                self.calls not in CALLS:
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
