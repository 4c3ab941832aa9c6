"""A decoder-only transformer language model with random weights, built offline: GPT-2-shaped (LayerNorm, GELU
MLP, learned positions) or Llama-shaped (RMSNorm, SwiGLU MLP, rotary positions), sized by typed keys.

The project's own compact definition rather than a model library's: the harness needs nothing but the shape
(no tokenizer, no hub, no weights), its blocks are one `nn.ModuleList` that FSDP2 and ZeRO shard block by block
and activation checkpointing wraps, and it adds no dependency. It trains on next-token prediction:
`forward(tokens)` gives (batch, sequence, vocabulary) logits, which harness.core.inputs.loss compares with the
next tokens."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as recompute

from harness.core.config import DataConfig
from harness.core.errors import ConfigError
from harness.core.inputs import Inputs, bound_options, tokens

Shape = Literal["gpt2", "llama"]


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, shape: Shape, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout, self.rotary = heads, dropout, shape == "llama"
        self.qkv = nn.Linear(width, 3 * width, bias=shape == "gpt2")
        self.out = nn.Linear(width, width, bias=shape == "gpt2")

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(width, dim=-1))
        if self.rotary:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(batch, length, width))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (RoFormer): each pair of a head's dimensions turned by its position's angle."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, width: int, shape: Shape, dropout: float) -> None:
        super().__init__()
        self.gated = shape == "llama"
        hidden = 8 * math.ceil(8 * width / 3 / 8) if self.gated else 4 * width  # SwiGLU keeps the parameters
        self.up = nn.Linear(width, (2 if self.gated else 1) * hidden, bias=not self.gated)
        self.down = nn.Linear(hidden, width, bias=not self.gated)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.up(x).chunk(2, dim=-1)
            return self.drop(self.down(F.silu(gate) * up))
        return self.drop(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    """Pre-norm: x + attention(norm(x)), then x + mlp(norm(x)). The unit FSDP2 shards and checkpointing wraps."""

    def __init__(self, width: int, heads: int, shape: Shape, dropout: float) -> None:
        super().__init__()
        norm = nn.LayerNorm if shape == "gpt2" else nn.RMSNorm
        self.attention_norm, self.attention = norm(width), Attention(width, heads, shape, dropout)
        self.mlp_norm, self.mlp = norm(width), MLP(width, shape, dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """`layers` blocks of `width` over `heads` heads; `vocab_size` tokens, sequences of `seq_len`. `checkpoint`:
    each block's activations recomputed in backward instead of kept (activation checkpointing). `dropout` 0:
    the same update whatever the strategy (strict numerical parity)."""

    def __init__(self, layers: int = 2, width: int = 64, heads: int = 4, vocab_size: int = 256, seq_len: int = 64,
                 shape: Shape = "gpt2", dropout: float = 0.0, checkpoint: bool = False, name: str = "gpt") -> None:
        super().__init__()
        for key, value in (("layers", layers), ("width", width), ("heads", heads), ("vocab_size", vocab_size),
                           ("seq_len", seq_len)):
            if value < 1:
                raise ConfigError(f"model.{key}", value, "an integer >= 1")
        if width % heads or (width // heads) % 2:
            raise ConfigError("model.width", width, f"a multiple of 2 x model.heads ({heads}), so that each head has "
                              "an even width")
        if shape not in ("gpt2", "llama"):
            raise ConfigError("model.shape", shape, "gpt2 or llama")
        self.seq_len, self.checkpoint = seq_len, checkpoint
        self.embedding = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(seq_len, width) if shape == "gpt2" else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, shape, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(width) if shape == "gpt2" else nn.RMSNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        half = width // heads // 2
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float32),
                             10000.0 ** (-torch.arange(half, dtype=torch.float32) / half))
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    @classmethod
    def inputs(cls, options: Mapping[str, Any], data: DataConfig) -> Inputs:
        """Sequences of `seq_len` token ids below `vocab_size` (the options as given, else the defaults above)."""
        bound = bound_options(cls, options)
        return tokens(int(bound["seq_len"]), int(bound["vocab_size"]))

    def block_names(self) -> list[str]:
        """The transformer blocks: the units FSDP2 shards one by one."""
        return [f"blocks.{i}" for i in range(len(self.blocks))]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embedding(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(length, device=tokens.device))
        x = self.drop(x)
        cos, sin = self.cos[:length], self.sin[:length]
        for block in self.blocks:
            if self.checkpoint and torch.is_grad_enabled():
                x = recompute(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        return self.head(self.norm(x))
