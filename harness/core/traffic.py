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
only that shard: 1/shard of the named payload.

Tensor parallelism (`Traffic.tensor_parallel` > 1) sends activations, not parameters: payload `activations` is one
block's activations, micro-batch x sequence x width elements in the forward's dtype, sent `count` times a block
(`calls="per_block"`) over the `tp` group (consecutive ranks); with data parallelism beside it (FSDP x TP) the
parameter collectives run over `dp`, the ranks holding the same slice (`activation_bytes` sizes one).

A pipeline (strategy=pp) sends point to point (`send_recv`): each stage boundary's `stage_activations` (one
microbatch's, micro-batch x sequence x width) forward and their gradient backward, every microbatch;
`Traffic.microbatches` and `stages_per_rank` give its schedule's idle share (`pipeline_bubble`).

With activation checkpointing a block's forward runs again in backward, and with it the `recomputed` of its calls;
a head split by vocabulary adds the reductions of torch's `loss_parallel` (the planner's, from the model's plan).
Sequence parallelism leaves the parameters of the modules its plan gives torch's `SequenceParallel` (the norms) whole
on every rank, their gradients partial sums over the sequence's shards: `whole_grads`, one all-reduce a parameter
(`calls="per_param"`) over the `tp` group."""

from __future__ import annotations

from dataclasses import dataclass

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv")
PAYLOADS = ("grads", "params", "stored_params", "powersgd", "activations", "stage_activations", "whole_grads")
OVERLAPS = ("backward", "forward", "none")  # what the collective can hide under; none: it is waited for
CALLS = ("whole", "per_param", "per_block")  # one call for the payload (or its buckets and units), one per
# parameter, or (activations) `count` calls in each transformer block
BUFFERS = ("grads", "unit_params", "unit_grads", "bucket", "params")
GROUPS = ("world", "shard", "replicate", "tp", "dp")  # over which ranks a collective runs (HSDP's, FSDP x TP's)
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
    count: int = 1  # per_block: calls in each block (tensor parallel: 2, one after the attention, one after the MLP)
    # per_block: of those, the calls a checkpointed block's recomputation runs again in backward (torch's checkpoint
    # stops recomputing once it has every tensor backward saved, so the block's last reduction is not re-run)
    recomputed: int = 0
    # per_block: a call on the residual stream (a norm's output, a block input's gradient), in the model's own dtype
    # (float32 under autocast, O1), not in the projections' half type (their outputs and those outputs' gradients)
    residual: bool = False

    def __post_init__(self) -> None:
        if self.count < 1 or (self.payload == "activations") != (self.calls == "per_block"):
            raise ValueError(f"activations are sent per block, at least once: {self}")
        if not 0 <= self.recomputed <= (self.count if self.calls == "per_block" else 0):
            raise ValueError(f"only a block's own calls are recomputed, at most `count` of them: {self}")
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
    # TP: consecutive ranks splitting each block's weights and sharing their activations; 0: all of them (strategy=tp)
    tensor_parallel: int = 1
    sequence_parallel: bool = False  # TP's norms and residual stream split along the sequence too
    microbatches: int = 0  # a pipeline's microbatches per step (0: not a pipeline; pipeline_bubble)
    stages_per_rank: int = 1  # a pipeline's stages on each rank (interleaved schedules: more than one)
    pipeline_ranks: int = 0  # a pipeline's ranks: 0, every rank (strategy=pp); N, FSDP x PP's N stages a pipeline

    def __post_init__(self) -> None:
        if self.replicate < 1 or self.tensor_parallel < 0:
            raise ValueError(f"replicate must be at least 1, tensor_parallel at least 0 (every rank): {self}")

    def sharded_over(self, world_size: int) -> int:
        """The ranks one copy of what the strategy shards is spread over (`StrategySpec.shards` divides by this):
        the world, or one of HSDP's shard groups."""
        return max(1, world_size // self.replicate)

    def tensor_parallel_over(self, world_size: int) -> int:
        """The ranks of one tensor-parallel group, which share a batch: 1 without TP, the world for strategy=tp."""
        return world_size if self.tensor_parallel == 0 else self.tensor_parallel


def activation_bytes(collective: Collective, tokens: int, width: int, element_bytes: int, blocks: int) -> int:
    """Bytes one rank's calls of an `activations` collective carry in one micro-batch's pass: `count` per block, each
    the block's whole activations (`tokens` = micro-batch x sequence, of `width`), whatever the op: an all-reduce
    moves them, an all-gather assembles them, a reduce-scatter starts from them (the α-β model prices each from
    the full size and its group)."""
    if collective.payload != "activations":
        raise ValueError(f"not an activation collective: {collective}")
    return collective.count * blocks * tokens * width * element_bytes


def tensor_parallel_share(tp: int, sequence_parallel: bool, checkpoint: str) -> float:
    """The share of a whole model's activations that one of `tp` tensor-parallel ranks holds. Per block and token,
    Korthikanti et al. 2022 (arXiv 2205.05198, Table 2) count 34 h bytes at 16 bits without attention's scores
    (flash attention keeps none): 24 of them split by heads or MLP width, 10 whole without sequence parallelism
    (the norms' inputs, the inputs of the q|k|v and up projections, the dropout masks). With sequence
    parallelism Megatron splits all 34; DTensor's SequenceParallel keeps the projections' all-gathered inputs (4 of
    the 10) whole, as Linear saves them: 4 + 30/tp. Measured here in a fake process group of 2 (one rank's peak,
    harness.prediction.calibrate): 0.62-0.63 of the whole model's activations without sequence parallelism
    (formula 0.647), 0.57 with (0.559). Full checkpointing keeps the blocks' inputs alone: whole on every rank
    without sequence parallelism, split along the sequence with it. What lies outside the blocks (embeddings,
    logits) is counted by the caller (harness.prediction.predict.tensor_parallel_rank_activations)."""
    if tp <= 1:
        return 1.0
    if checkpoint == "full":
        return 1 / tp if sequence_parallel else 1.0
    return (4 + 30 / tp) / 34 if sequence_parallel else (10 + 24 / tp) / 34


def pipeline_bubble(traffic: Traffic, ranks: int) -> float:
    """The share of a pipelined step each rank idles, waiting for the pipeline to fill and drain: (p - 1) / (m + p - 1)
    for p ranks of one stage each and m microbatches (GPipe and 1F1B alike: 1F1B changes what is held, not the
    idle time), divided by the stages each rank holds (interleaved 1F1B's virtual stages fill the pipeline v times
    faster: Narayanan et al. 2021). 0 for a strategy that is not a pipeline, or one rank."""
    if traffic.microbatches < 1 or ranks < 2:
        return 0.0
    return (ranks - 1) / (traffic.microbatches + ranks - 1) / traffic.stages_per_rank
