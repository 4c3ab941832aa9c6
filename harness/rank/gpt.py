"""A decoder-only transformer language model with random weights, built offline: GPT-2-shaped (LayerNorm, GELU
MLP, learned positions) or Llama-shaped (RMSNorm, SwiGLU MLP, rotary positions), sized by typed keys, with the
variations the published models train with: grouped-query attention (`kv_heads`), Llama's SwiGLU hidden size
(`ffn_multiplier`, `multiple_of`, or `mlp_hidden`), no biases (`bias`), tied embeddings, the rotary base
(`rope_theta`), no positions at all (`positions`), three activation checkpointing modes (`checkpoint`) and a
cross-entropy taken in pieces (`loss_chunks`). conf/model/ names published sizes (gpt2_124m, mpt_7b, llama3_8b...).

The project's own compact definition rather than a model library's: the harness needs nothing but the shape
(no tokenizer, no hub, no weights), its blocks are one `nn.ModuleList` that FSDP2 and ZeRO shard block by block
and activation checkpointing wraps, and it adds no dependency. It trains on next-token prediction:
`forward(tokens)` gives (batch, sequence, vocabulary) logits, which `GPT.loss` (harness.core.inputs.loss, or the
same in pieces) compares with the next tokens."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as recompute
from torch.utils.checkpoint import create_selective_checkpoint_contexts

from harness.core.checkpointing import selective_policy
from harness.core.config import DataConfig
from harness.core.errors import ConfigError
from harness.core.fusion import one_kernel
from harness.core.inputs import Inputs, bound_options, loss, tokens

Shape = Literal["gpt2", "llama"]
Positions = Literal["learned", "rotary", "none"]
CheckpointMode = Literal["none", "full", "selective"]
CHECKPOINT_MODES: tuple[str, ...] = get_args(CheckpointMode)
# scaled_dot_product_attention(enable_gqa=True) (torch >= 2.5): key and value heads shared by groups of query heads
# inside the kernel; before it, they are repeated to every query head
_GQA_KERNEL = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def checkpoint_mode(value: object) -> CheckpointMode:
    """`model.checkpoint` as one of CHECKPOINT_MODES: true (what it always meant: each block recomputed) is
    "full", false "none"; the names as they are (any case)."""
    if isinstance(value, bool):
        return "full" if value else "none"
    if isinstance(value, str):
        name = {"true": "full", "false": "none"}.get(value.strip().lower(), value.strip().lower())
        if name in CHECKPOINT_MODES:
            return name  # type: ignore[return-value]
    raise ConfigError("model.checkpoint", value, "none, full or selective (true means full, false none)")


class Attention(nn.Module):
    """Causal self-attention over `heads` query heads sharing `kv_heads` key and value heads (grouped-query
    attention; `kv_heads` = `heads` is multi-head attention, 1 multi-query)."""

    def __init__(self, width: int, heads: int, kv_heads: int, bias: bool, rotary: bool, dropout: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dropout, self.rotary = heads, kv_heads, dropout, rotary
        self.kv_width = kv_heads * (width // heads)
        self.qkv = nn.Linear(width, width + 2 * self.kv_width, bias=bias)
        self.out = nn.Linear(width, width, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        projected = self.qkv(x)
        # tensor parallel (GPT.tp_plan): this rank's slice of q, k and v, so 1/shards of the heads; 1 on one device
        shards = self.qkv.out_features // projected.shape[-1]
        kv_width = self.kv_width // shards
        q, k, v = projected.split((projected.shape[-1] - 2 * kv_width, kv_width, kv_width), dim=-1)
        q = q.view(batch, length, self.heads // shards, -1).transpose(1, 2)
        k, v = (t.view(batch, length, self.kv_heads // shards, -1).transpose(1, 2) for t in (k, v))
        if self.rotary:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        grouped: dict[str, bool] = {}
        if self.kv_heads != self.heads:
            if _GQA_KERNEL:
                grouped["enable_gqa"] = True
            else:
                k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
                                           **grouped)
        return self.out(y.transpose(1, 2).reshape(batch, length, -1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (RoFormer): each pair of a head's dimensions turned by its position's angle."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1).to(x.dtype)


def swiglu_hidden(width: int, ffn_multiplier: float | None, multiple_of: int) -> int:
    """Llama's SwiGLU hidden size as Meta's llama code computes it: two thirds of 4 x width (the gate keeps the
    parameters of a 4 x width GELU MLP), times `ffn_multiplier` if given, rounded up to a multiple of `multiple_of`
    (Llama 3 8B: 4096, 1.3, 1024 -> 14336). With multiple_of 8 and no multiplier it is 8 x ceil(8 x width / 3 / 8),
    this model's size before these options (int() drops less than 1/3, never past a multiple of 8)."""
    hidden = int(2 * 4 * width / 3)
    if ffn_multiplier is not None:
        hidden = int(ffn_multiplier * hidden)
    return multiple_of * math.ceil(hidden / multiple_of)


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int, gated: bool, bias: bool, dropout: float) -> None:
        super().__init__()
        self.gated = gated
        self.up = nn.Linear(width, (2 if gated else 1) * hidden, bias=bias)
        self.down = nn.Linear(hidden, width, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.up(x).chunk(2, dim=-1)
            return self.drop(self.down(F.silu(gate) * up))
        return self.drop(self.down(F.gelu(self.up(x))))


def _norm(shape: Shape, width: int, bias: bool) -> nn.Module:
    return nn.LayerNorm(width, bias=bias) if shape == "gpt2" else nn.RMSNorm(width)


class Block(nn.Module):
    """Pre-norm: x + attention(norm(x)), then x + mlp(norm(x)). The unit FSDP2 shards and checkpointing wraps."""

    def __init__(self, width: int, heads: int, kv_heads: int, hidden: int, shape: Shape, bias: bool, rotary: bool,
                 dropout: float) -> None:
        super().__init__()
        self.attention_norm = _norm(shape, width, bias)
        self.attention = Attention(width, heads, kv_heads, bias, rotary, dropout)
        self.mlp_norm, self.mlp = _norm(shape, width, bias), MLP(width, hidden, shape == "llama", bias, dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


# checkpoint="selective": torchtitan's per-op selective activation checkpointing, its policy
# harness.core.checkpointing's (`selective_policy`), which a user's model that names its blocks follows too.


def _selective_contexts() -> Any:
    return create_selective_checkpoint_contexts(selective_policy())


class FusedCrossEntropy(torch.autograd.Function):
    """The summed cross-entropy of rows of logits against their targets (-100: ignored), as fused kernels compute it
    (flash-attn's cross_entropy, Liger's): a chunk of rows at a time, each upcast to float32 only while its
    log-sum-exp is taken; backward keeps the logits and one float32 per row, and writes the gradient
    (softmax - one-hot, scaled) into the logits' own memory, which nothing else needs once the loss is taken (the
    layer that made them keeps its input, not its output). Each chunk is one kernel (harness.core.fusion) for the
    planner's timing."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, chunks: int) -> torch.Tensor:
        rows = [(piece, target) for piece, target in zip(logits.chunk(chunks), targets.chunk(chunks), strict=True)]
        sums, lses = [], []
        for piece, target in rows:
            with one_kernel() as kernel:
                wide = piece.float()
                lse = torch.logsumexp(wide, dim=-1)
                picked = wide.gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1)
                sums.append(((lse - picked) * (target != -100)).sum())
                lses.append(lse)
                kernel.writes(lse, sums[-1])
        ctx.save_for_backward(logits, targets, torch.cat(lses))
        ctx.chunks = chunks
        return torch.stack(sums).sum()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, targets, lse = ctx.saved_tensors
        for piece, target, row_lse in zip(logits.chunk(ctx.chunks), targets.chunk(ctx.chunks),
                                          lse.chunk(ctx.chunks), strict=True):
            with one_kernel():
                wide = torch.exp(piece.float() - row_lse.unsqueeze(1))
                wide.scatter_add_(1, target.clamp_min(0).unsqueeze(1), -torch.ones_like(row_lse).unsqueeze(1))
                piece.copy_(wide * ((target != -100).unsqueeze(1) * grad))
        return logits, None, None


class GPT(nn.Module):
    """`layers` blocks of `width` over `heads` heads; `vocab_size` tokens, sequences of `seq_len`. `dropout` 0:
    the same update whatever the strategy (strict numerical parity). The other options keep this model's first
    behaviour at their defaults; conf/model/gpt.yaml and docs/workloads.md say what each does."""

    def __init__(self, layers: int = 2, width: int = 64, heads: int = 4, vocab_size: int = 256, seq_len: int = 64,
                 shape: Shape = "gpt2", dropout: float = 0.0,
                 checkpoint: bool | CheckpointMode = False, name: str = "gpt",
                 kv_heads: int | None = None, mlp_hidden: int | None = None, ffn_multiplier: float | None = None,
                 multiple_of: int = 8, bias: bool | None = None, tie_embeddings: bool = False,
                 rope_theta: float = 10000.0, positions: Positions | None = None, loss_chunks: int = 0) -> None:
        super().__init__()
        for key, value in (("layers", layers), ("width", width), ("heads", heads), ("vocab_size", vocab_size),
                           ("seq_len", seq_len), ("multiple_of", multiple_of)):
            if value < 1:
                raise ConfigError(f"model.{key}", value, "an integer >= 1")
        if width % heads or (width // heads) % 2:
            raise ConfigError("model.width", width, f"a multiple of 2 x model.heads ({heads}), so that each head has "
                              "an even width")
        if shape not in ("gpt2", "llama"):
            raise ConfigError("model.shape", shape, "gpt2 or llama")
        kv_heads = heads if kv_heads is None else kv_heads
        if kv_heads < 1 or heads % kv_heads:
            raise ConfigError("model.kv_heads", kv_heads, f"a divisor of model.heads ({heads}): each key and value "
                              "head serves the same number of query heads (null: as many as model.heads)")
        if mlp_hidden is not None and mlp_hidden < 1:
            raise ConfigError("model.mlp_hidden", mlp_hidden, "an integer >= 1, or null (the shape's own)")
        if ffn_multiplier is not None and (ffn_multiplier <= 0 or shape != "llama"):
            raise ConfigError("model.ffn_multiplier", ffn_multiplier, "a number > 0 with model.shape=llama (it scales "
                              "the SwiGLU hidden size; model.mlp_hidden sets any shape's), or null")
        if not rope_theta > 0:
            raise ConfigError("model.rope_theta", rope_theta, "a number > 0 (the rotary base: 10000, Llama 3 500000)")
        if positions is not None and positions not in get_args(Positions):
            raise ConfigError("model.positions", positions, "learned, rotary, none, or null (as the shape: gpt2 "
                              "learned, llama rotary)")
        if loss_chunks < 0:
            raise ConfigError("model.loss_chunks", loss_chunks, "an integer >= 0 (0: the cross-entropy in one piece)")
        bias = shape == "gpt2" if bias is None else bias
        positions = positions or ("learned" if shape == "gpt2" else "rotary")
        if mlp_hidden is None:
            mlp_hidden = swiglu_hidden(width, ffn_multiplier, multiple_of) if shape == "llama" else 4 * width
        self.seq_len, self.checkpoint, self.loss_chunks = seq_len, checkpoint_mode(checkpoint), loss_chunks
        # the fused cross-entropy takes the logits as they come and upcasts chunk by chunk: the amp levels leave the
        # outputs in half (amp/native.py upcasts_in_loss) instead of a float32 copy of every logit
        self.upcasts_in_loss = loss_chunks > 0
        self.embedding = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(seq_len, width) if positions == "learned" else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, kv_heads, mlp_hidden, shape, bias, positions == "rotary",
                                          dropout) for _ in range(layers))
        self.norm = _norm(shape, width, bias)
        # tied: the logits are made with the embedding's own weight (no parameter of the head's), which stays one
        # tensor wherever the model is moved or sharded
        self.head = None if tie_embeddings else nn.Linear(width, vocab_size, bias=False)
        half = width // heads // 2
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float32),
                             float(rope_theta) ** (-torch.arange(half, dtype=torch.float32) / half))
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

    @classmethod
    def tp_sizes(cls, options: Mapping[str, Any], sequence_parallel: bool) -> dict[str, int]:
        """What tensor parallelism splits across its ranks, by the key that sets it: each must divide by the degree
        (strategies.tp checks it before launch; each rank computes heads / degree of the heads; with sequence
        parallelism each holds seq_len / degree of the residual stream)."""
        bound = bound_options(cls, options)
        heads = int(bound["heads"])
        sizes = {"model.heads": heads, "model.kv_heads": int(bound["kv_heads"] or heads)}
        if bound["mlp_hidden"] is not None:
            sizes["model.mlp_hidden"] = int(bound["mlp_hidden"])
        if sequence_parallel:
            sizes["model.seq_len"] = int(bound["seq_len"])
        if not bound["tie_embeddings"] and not bound["loss_chunks"]:  # the head split by vocabulary
            sizes["model.vocab_size"] = int(bound["vocab_size"])
        return sizes

    @classmethod
    def tp_activations(cls, options: Mapping[str, Any]) -> tuple[int, int]:
        """(width, blocks): what each of tensor parallelism's collectives carries per token, and how many blocks
        send them (the planner's price of strategy=tp)."""
        bound = bound_options(cls, options)
        return int(bound["width"]), int(bound["layers"])

    def tp_plan(self, sequence_parallel: bool) -> dict[str, Any]:
        """Megatron's tensor parallelism for these blocks, as `parallelize_module` takes it (module name -> style):
        q, k, v and the MLP's up (and gate) projections split by output features, the attention's output and the
        MLP's down projection by input features, so each block's attention and MLP end in one reduction.
        `sequence_parallel`: the norms and the residual stream between them split along the sequence, the two
        all-reduces becoming an all-gather before each projection and a reduce-scatter after it (and the final norm
        too). The head is split by vocabulary (`vocab_parallel`: its logits stay DTensor shards, the loss taken on
        them), else whole; the embeddings stay whole on every rank. The fused projections (q|k|v, gate|up) are split
        section by section (strategies.tp.SectionedColwise), so that each rank holds whole heads."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            PrepareModuleInputOutput,
            PrepareModuleOutput,
            RowwiseParallel,
            SequenceParallel,
        )

        from strategies.tp import SectionedColwise

        plan: dict[str, Any] = {}
        for i, block in enumerate(self.blocks):
            attention, mlp = block.attention, block.mlp
            qkv = (attention.qkv.out_features - 2 * attention.kv_width, attention.kv_width, attention.kv_width)
            up = SectionedColwise((mlp.down.in_features,) * 2) if mlp.gated else ColwiseParallel()
            out = RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel()
            down = RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel()
            plan.update({f"blocks.{i}.attention.qkv": SectionedColwise(qkv), f"blocks.{i}.attention.out": out,
                         f"blocks.{i}.mlp.up": up, f"blocks.{i}.mlp.down": down})
            if sequence_parallel:
                whole = (Replicate(), None, None)
                plan.update({
                    f"blocks.{i}.attention_norm": SequenceParallel(), f"blocks.{i}.mlp_norm": SequenceParallel(),
                    f"blocks.{i}.attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                                 desired_input_layouts=whole, use_local_output=True),
                    f"blocks.{i}.mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                           use_local_output=True)})
        vocab_parallel = self.vocab_parallel
        if sequence_parallel:  # the residual stream split along the sequence from the first block to the last
            first, last = "blocks.0", f"blocks.{len(self.blocks) - 1}"
            split = dict(input_layouts=(Replicate(), None, None), desired_input_layouts=(Shard(1), None, None),
                         use_local_input=True)
            joined = dict(output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=True)
            if vocab_parallel:  # the final norm on the sequence's shards too; the head gathers them
                plan[first] = PrepareModuleInput(input_layouts=split["input_layouts"],
                                                 desired_input_layouts=split["desired_input_layouts"],
                                                 use_local_output=True)
                plan["norm"] = SequenceParallel()
            elif first == last:
                plan[first] = PrepareModuleInputOutput(**split, **joined)
            else:
                plan[first] = PrepareModuleInput(input_layouts=split["input_layouts"],
                                                 desired_input_layouts=split["desired_input_layouts"],
                                                 use_local_output=True)
                plan[last] = PrepareModuleOutput(**joined)
        if vocab_parallel:  # the logits split by vocabulary: the loss is taken on the shards (loss_parallel)
            plan["head"] = ColwiseParallel(input_layouts=Shard(1) if sequence_parallel else Replicate(),
                                           output_layouts=Shard(-1), use_local_output=False)
        return plan

    @property
    def vocab_parallel(self) -> bool:
        """Under tensor parallelism the head is split by vocabulary and the cross-entropy taken on the logits'
        shards (torchtitan's loss parallelism: a rank holds 1/N of the logits), unless the head is the embedding's
        weight (tied) or the loss is the fused one (`loss_chunks`), which takes whole rows."""
        return self.head is not None and not self.loss_chunks

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embedding(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(length, device=tokens.device))
        x = self.drop(x)
        cos, sin = self.cos[:length], self.sin[:length]
        recomputed = self.checkpoint != "none" and torch.is_grad_enabled()
        for block in self.blocks:
            if recomputed and self.checkpoint == "selective":
                x = recompute(block, x, cos, sin, use_reentrant=False, context_fn=_selective_contexts)
            elif recomputed:
                x = recompute(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        x = self.norm(x)
        return F.linear(x, self.embedding.weight) if self.head is None else self.head(x)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of the logits against the next tokens: harness.core.inputs.loss, or with
        `loss_chunks` > 0 a fused cross-entropy (FusedCrossEntropy) taking the rows in that many chunks: backward
        keeps the logits alone and writes their gradient over them, at their own dtype. Float32 throughout (the
        plain loss follows the logits' dtype)."""
        if not self.loss_chunks:
            return loss(outputs, targets)
        logits, targets = outputs.flatten(0, -2), targets.flatten()
        total = FusedCrossEntropy.apply(logits, targets, min(self.loss_chunks, logits.shape[0]))
        return total / (targets != -100).sum()  # F.cross_entropy's mean: over the targets not ignored
