"""A transformer of your own that tells the harness what it needs to know (docs/workloads.md):

- its blocks (`block_names`): the units FSDP2 shards, and the submodules `model.checkpoint=full|selective`
  recomputes in backward;
- its tensor-parallel plan (`tp_plan`), which `strategy=tp` and `strategy=fsdp strategy.tp=N` apply;
- optionally, what the plan splits (`tp_sizes`: each must divide by the tensor-parallel ranks, checked before
  anything starts) and what its collectives carry (`tp_activations`: the planner's price of tensor parallelism).

    python run.py model=custom model._target_=examples.custom_transformer.Transformer model.checkpoint=full \\
        data=custom data._target_=examples.custom_transformer.batches data.sample=tokens data.tokens_per_sample=32

The `_target_` is the class itself, so that a strategy can read its declarations before anything is built. A batch
is `n` sequences of SEQ_LEN token ids below VOCAB, each token followed by its entry of a fixed random table most of
the time (learnable, as model=gpt's synthetic batches are); the targets are the next tokens."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ_LEN = 64, 32
TABLE_SEED, FOLLOWS = 4321, 0.8  # the successor table, and how often a token follows its entry of it


class Block(nn.Module):
    """Pre-norm attention and MLP. q, k and v are separate projections so that splitting each by output features
    gives every tensor-parallel rank whole heads (`forward` counts the heads it holds from its slice)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.head_width = width // heads
        self.attention_norm, self.mlp_norm = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x)
        batch, length = h.shape[0], h.shape[1]
        q, k, v = (p(h).view(batch, length, -1, self.head_width).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(batch, length, -1))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class Transformer(nn.Module):
    """`layers` blocks of `width` over `heads` heads, next-token logits over VOCAB for sequences of SEQ_LEN."""

    def __init__(self, layers: int = 2, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.embedding, self.positions = nn.Embedding(VOCAB, width), nn.Embedding(SEQ_LEN, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, VOCAB)

    def block_names(self) -> list[str]:
        """The blocks: FSDP2's units, and what activation checkpointing recomputes."""
        return [f"blocks.{i}" for i in range(len(self.blocks))]

    @classmethod
    def own_options(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """This class's keyword arguments as given, the rest at their defaults (keys it does not take are left out:
        the harness's own `checkpoint` among them)."""
        parameters = inspect.signature(cls).parameters
        return {name: given.get(name, p.default) for name, p in parameters.items()}

    @classmethod
    def tp_sizes(cls, options: Mapping[str, Any], sequence_parallel: bool) -> dict[str, int]:
        """What the plan splits, by the option that sets it: each rank computes heads / N of the heads, so N must
        divide them (the harness refuses it before anything starts, naming the key). With `sequence_parallel` N
        must divide SEQ_LEN (32) too, which is not an option: not listed."""
        return {"model.heads": int(cls.own_options(options)["heads"])}

    @classmethod
    def tp_activations(cls, options: Mapping[str, Any]) -> tuple[int, int]:
        """(width, blocks): what each of the plan's collectives carries per token, and how many blocks send them
        (two a block each way, after the attention and after the MLP)."""
        own = cls.own_options(options)
        return int(own["width"]), int(own["layers"])

    def tp_plan(self, sequence_parallel: bool) -> dict[str, Any]:
        """Megatron's split, by module name: q, k, v and the MLP's up projection by output features, the attention's
        output and the MLP's down projection by input features (one reduction after each). With `sequence_parallel`
        the norms and the residual stream are split along the sequence too: the first block takes its slice of the
        sequence, the final norm keeps it, and the head gathers the logits back. The embeddings stay whole."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            RowwiseParallel,
            SequenceParallel,
        )

        split = {"input_layouts": Shard(1)} if sequence_parallel else {}
        joined = {"output_layouts": Shard(1)} if sequence_parallel else {}
        plan: dict[str, Any] = {}
        for name in self.block_names():
            plan.update({f"{name}.{p}": ColwiseParallel(**split) for p in ("q", "k", "v", "up")})
            plan.update({f"{name}.out": RowwiseParallel(**joined), f"{name}.down": RowwiseParallel(**joined)})
            if sequence_parallel:
                plan.update({f"{name}.attention_norm": SequenceParallel(), f"{name}.mlp_norm": SequenceParallel()})
        if sequence_parallel:
            plan.update({"blocks.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                        use_local_output=True),
                         "norm": SequenceParallel(),
                         "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
        return plan

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # (n, SEQ_LEN, VOCAB): the harness's cross-entropy against the next tokens


def batches(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` sequences drawn from `generator` on the CPU, as (tokens, next tokens)."""
    table = torch.randint(0, VOCAB, (VOCAB,), generator=torch.Generator().manual_seed(TABLE_SEED))
    tokens = torch.empty(n, SEQ_LEN + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (n,), generator=generator)
    for i in range(1, SEQ_LEN + 1):
        follows = torch.rand(n, generator=generator) < FOLLOWS
        tokens[:, i] = torch.where(follows, table[tokens[:, i - 1]], torch.randint(0, VOCAB, (n,), generator=generator))
    return tokens[:, :-1], tokens[:, 1:]
