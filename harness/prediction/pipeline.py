"""A pipeline's prediction (strategy=pp): each rank holds a stage, a run of the model's blocks, and works on
microbatches of the global batch; the step is the slowest rank's microbatches plus the schedule's idle time.

A stage is predicted as a model of its own: the model at the rank's block count (its `layers` option), traced and
timed at one microbatch. Traced at k and k + 1 blocks, the difference is one block's bytes by kind; what is not in a
block is put where the cut puts it: the parameters the model uses before its first block (embeddings) on the first
rank, the rest (final norm, head) and the logits' activations on the last; every stage between holds blocks only. A rank keeps the activations of the
microbatches it has started and not yet finished backward: all of them under GPipe, at most the ranks from it to the
last under 1F1B (the first rank p, the last one; interleaved 1F1B taken as 1F1B's). Its time: the slowest rank's
forward and backward of one microbatch (the stage model with the embeddings and the head: an upper bound by the
embeddings), times the microbatches, over 1 - the bubble (harness.core.traffic.pipeline_bubble), plus every
boundary's activations sent forward and their gradients back, one hop each, waited for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.core.amp_levels import AmpSpec
from harness.core.config import RunConfig
from harness.core.inputs import Inputs
from harness.core.traffic import Traffic, pipeline_bubble
from harness.prediction.hardware import Preset
from harness.prediction.links import collective_seconds
from harness.prediction.trace import PhasePeak, StepTrace

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class NotAPipelineModel(ValueError):
    """A model the stage model cannot predict (no `layers` option or no declared width)."""


def rank_blocks(layers: int, ranks: int, stages_per_rank: int) -> list[int]:
    """Blocks each rank holds: stage s on rank s % ranks, stage s's blocks as strategies.pp cuts them (as even as
    possible, the later stages taking the extra ones)."""
    stages = ranks * stages_per_rank
    if layers < stages:
        raise NotAPipelineModel(f"{layers} blocks cannot make {stages} stages")
    held = [0] * ranks
    for s in range(stages):
        held[s % ranks] += (s + 1) * layers // stages - s * layers // stages
    return held


def microbatches_per_round(schedule_microbatches: int, ranks: int) -> int:
    """Interleaved 1F1B's round: the microbatches it runs through one local stage before the next (torch's
    ScheduleInterleaved1F1B: the microbatches over max(1, microbatches // ranks) rounds)."""
    return schedule_microbatches // max(1, schedule_microbatches // ranks)


def in_flight(schedule_microbatches: int, ranks: int, rank: int, all_held: bool, stages_per_rank: int = 1) -> int:
    """Microbatches whose activations rank `rank` holds at once: all under GPipe, else at most the ranks from it
    to the last (1F1B's warm-up, torch's Schedule1F1B running each steady step's backward before its forward).
    With `stages_per_rank` > 1 (interleaved 1F1B) the count is of chunks, a microbatch through one of the rank's
    stages: torch's `_get_warmup_ops` forwards (stages_per_rank - 1) x the microbatches of a round + 2 per rank
    after this one, and each steady step's forward runs before its backward (`_get_1f1b_rank_ops`): one more."""
    if all_held:
        return schedule_microbatches
    if stages_per_rank == 1:
        return min(schedule_microbatches, ranks - rank)
    chunks = stages_per_rank * schedule_microbatches
    per_round = microbatches_per_round(schedule_microbatches, ranks)
    warmup = (stages_per_rank - 1) * per_round + 2 * (ranks - 1 - rank)
    return min(warmup + 1, chunks)


def sends_alive(schedule_microbatches: int, ranks: int, rank: int, stages_per_rank: int = 1) -> int:
    """Boundaries rank `rank` has sent and torch still holds at its peak. Interleaved 1F1B runs through torch's
    `_PipelineScheduleRuntime`, which waits for its sends only at the step's end, each send keeping its tensor: by
    the rank's last steady backward (its peak: as many chunks in flight as ever, the most sends behind it) each
    backward done has sent its gradient back (but on the first stage) and left the output its chunk sent forward
    (but on the last stage) alive. Its backwards go a round of microbatches a local stage, the last local stage
    first (checked against torch's action lists). Schedule1F1B waits for each send before the next, and GPipe's
    peak comes before its first backward's send: none."""
    if stages_per_rank == 1:
        return 0
    done = stages_per_rank * schedule_microbatches - in_flight(schedule_microbatches, ranks, rank, False,
                                                               stages_per_rank)
    per_round = microbatches_per_round(schedule_microbatches, ranks)
    cycles, rest = divmod(done, stages_per_rank * per_round)

    def on(local: int) -> int:  # of the backwards done, those of the rank's `local`-th stage
        return cycles * per_round + min(per_round, max(0, rest - (stages_per_rank - 1 - local) * per_round))

    return 2 * done - (on(0) if rank == 0 else 0) - (on(stages_per_rank - 1) if rank == ranks - 1 else 0)


def model_layers(cfg: RunConfig) -> int:
    """The model's block count: its `layers` option, or its constructor's default for it."""
    import inspect

    from hydra.utils import get_object

    layers = cfg.model.get("layers")
    if layers is None:
        parameter = inspect.signature(get_object(str(cfg.model["_target_"]))).parameters.get("layers")
        layers = None if parameter is None else parameter.default
    if not isinstance(layers, int) or isinstance(layers, bool):
        raise NotAPipelineModel("the model has no `layers` option to predict a stage of it by")
    return layers


def before_blocks_share(cfg: RunConfig, inputs: Inputs) -> float:
    """Of the parameters outside the blocks, the share the model uses before its first block (the embeddings: the
    first stage's, as the cut puts them); the rest (final norm, head) is the last stage's. Read from the order a
    forward on the meta device calls the modules that own parameters, the model built with one block."""
    import torch

    from harness.prediction.trace import model_builder, on_meta

    model = on_meta(model_builder({**cfg.model, "layers": 1}, inputs))
    declared = getattr(model, "block_names", None)
    blocks = tuple(declared()) if callable(declared) else ()
    seen: list[tuple[str, int]] = []
    hooks = []
    for name, module in model.named_modules():
        inside = any(name == b or name.startswith(b + ".") for b in blocks)
        own = sum(p.numel() for p in module.parameters(recurse=False))
        if name in blocks[:1] or (own and not inside):
            hooks.append(module.register_forward_pre_hook(
                lambda _m, _a, name=name, own=own, inside=inside: seen.append((name, 0 if inside else own))))
    try:
        with torch.no_grad():
            model(inputs.example(1, "meta")[0])
    finally:
        for hook in hooks:
            hook.remove()
    names = [name for name, _ in seen]
    start = names.index(blocks[0]) if blocks and blocks[0] in names else len(seen)
    before = sum(size for _, size in seen[:start])
    after = sum(size for name, size in dict(seen[start:]).items())
    return before / (before + after) if before + after else 0.0


def stage_config(cfg: RunConfig, blocks: int) -> RunConfig:
    """The run's config with the model cut to `blocks` blocks: one stage as a model of its own."""
    model_layers(cfg)  # the model has such an option
    return dataclasses.replace(cfg, model={**cfg.model, "layers": blocks})


@dataclass(frozen=True)
class StageBytes:
    """One rank's bytes at one phase's peak, by kind (harness.prediction.predict's RankMemory's parts)."""

    params: float
    grads: float
    state: float
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.state + self.activations


def stage_bytes(fewer: StepTrace, more: StepTrace, blocks: int, first: bool, last: bool, held: int,
                microbatches: int, boundary: float, before_share: float = 0.5, stages_per_rank: int = 1,
                sent: int = 0) -> StageBytes:
    """A rank of `blocks` blocks from the traces at `blocks` (fewer) and `blocks` + 1 (more): the larger of its
    phases (forward and backward's, the optimizer step's). What is outside the blocks is split by `before_share`
    (the first stage's share of it, `before_blocks_share`).

    Each microbatch in flight keeps its blocks' saved tensors (the traces' difference per block as backward starts,
    `saved_activations`: where gradients outweigh activations the traces' peak is at the end of backward; their
    weights' half copies under autocast, `parameter_casts`, once: the schedule's step is one autocast region) and
    its output (torch's PipelineStage keeps it for the backward: one `boundary`, or on the last stage the model's
    output, which the whole model's step frees once the loss has it); a stage's input is its receive buffer
    (`receive_buffers`), not counted again. A stage before the last peaks in a block's backward, whose temporaries
    (`block_backward`) come on top of the microbatches held; the last in its loss's and head's backward
    (`backward_growth`), once: one backward runs at a time. Where a forward follows a backward (1F1B's steady
    state) it runs beside every gradient the stage makes; where every microbatch is held (GPipe) the peak is the
    first backward's, beside the gradients it has made (the head's, or a block's), unless one microbatch fewer
    beside them all is more.

    With `stages_per_rank` > 1 (interleaved) `held` counts chunks, each through one of the rank's stages (its
    blocks / stages_per_rank; on the first rank the first stage's are the first of every `stages_per_rank`); on
    the last rank one of them is the last stage's, whose head's backward follows its forward at once. `sent`: the
    boundaries the rank has sent and torch still holds at its peak (`sends_alive`)."""
    ends = (before_share if first else 0.0) + (1 - before_share if last else 0.0)
    grad_block = more.model_grads - fewer.model_grads
    stage_grads = blocks * grad_block + max(0, fewer.model_grads - blocks * grad_block) * ends
    heads = (1 if stages_per_rank > 1 else held) if last else 0  # chunks of the last stage's in flight
    received = held - (-(-held // stages_per_rank) if first else 0)  # chunks whose input is a receive buffer
    all_held = held >= microbatches * stages_per_rank
    cast_block = more.parameter_casts - fewer.parameter_casts  # one copy a step: the schedule's autocast caches it
    cast_rest = max(0, fewer.parameter_casts - blocks * cast_block)  # the head's (an embedding's lookup is not cast)
    casts = blocks * cast_block + (cast_rest if last else 0)
    saved_block = more.saved_activations - fewer.saved_activations - cast_block  # what a microbatch keeps a block
    saved_rest = max(0, fewer.saved_activations - fewer.parameter_casts - blocks * saved_block)  # and outside them

    def at(low: PhasePeak, high: PhasePeak, stepping: bool) -> StageBytes:
        def split(name: str) -> tuple[float, float]:
            block = getattr(high, name) - getattr(low, name)
            return block, max(0.0, getattr(low, name) - blocks * block)

        parts = {}
        for name in ("params", "masters", "grads", "optimizer_state"):
            block, rest = split(name)
            parts[name] = blocks * block + rest * ends
        block, rest = split("activations")
        if stepping:  # the optimizer's step runs with no microbatch in flight: its temporaries, once
            grads = max(parts["grads"], stage_grads) if held > 1 or microbatches > 1 else parts["grads"]
            return StageBytes(parts["params"] + parts["masters"], grads, parts["optimizer_state"],
                              blocks * block + (rest if last else boundary))
        backward = fewer.backward_growth if heads else more.block_backward

        def holding(n: int, grads: float) -> StageBytes:
            """`n` chunks in flight and a backward running, beside `grads`."""
            ends_kept = min(n, heads) * (saved_rest + fewer.output_bytes) + max(0, n - heads) * boundary
            acts = n * blocks / stages_per_rank * saved_block + ends_kept - min(n, received) * boundary + backward \
                + casts + sent * boundary
            return StageBytes(parts["params"] + parts["masters"], grads, parts["optimizer_state"], acts)

        if not all_held:
            return holding(held, max(parts["grads"], stage_grads))
        made = parts["grads"] if heads else min(grad_block, stage_grads)  # by the first backward, at its peak
        return max(holding(held, made), holding(held - 1, stage_grads), key=lambda b: b.total)

    low_phases = fewer.phases or (PhasePeak(fewer.peak, fewer.params, fewer.masters, fewer.grads,
                                            fewer.optimizer_state, fewer.activations),)
    high_phases = more.phases or (PhasePeak(more.peak, more.params, more.masters, more.grads,
                                            more.optimizer_state, more.activations),)
    return max((at(lo, hi, i == 1) for i, (lo, hi) in enumerate(zip(low_phases, high_phases, strict=True))),
               key=lambda b: b.total)


def receive_buffers(size: float, microbatches: int, rank: int, ranks: int, stages_per_rank: int = 1) -> float:
    """What a rank's stages allocate to receive, one buffer a microbatch each (torch's PipelineStage prepares them at
    its first step): the activations from the stage before, the gradients from the stage after. Rank `rank` holds
    stages rank, rank + ranks, ...: only the first has no stage before it, only the last none after."""
    stages = [rank + j * ranks for j in range(stages_per_rank)]
    final = ranks * stages_per_rank - 1
    return microbatches * size * sum((0 if s == 0 else 1) + (0 if s == final else 1) for s in stages)


def boundary_bytes(cfg: RunConfig, amp: AmpSpec, microbatch: int, tokens: int) -> float:
    """One stage boundary's activations for one microbatch: microbatch x sequence x width (the model's
    `tp_activations(options)` gives its width, as for tensor parallelism), in the half type where the amp level
    casts the model (`cast_model`), else float32: under autocast (O1) a block's output is its input plus its half-precision branches,
    and the sum keeps the input's float32 (measured: strategy=pp at O1 bf16 received 0.5 MiB on model=gpt, where
    bfloat16 boundaries would be 0.25)."""
    from hydra.utils import get_object

    declared = getattr(get_object(str(cfg.model["_target_"])), "tp_activations", None)
    if not callable(declared):
        raise NotAPipelineModel("the model does not say its blocks' width (tp_activations)")
    width, _ = declared({k: v for k, v in cfg.model.items() if not k.startswith("_")})
    return float(microbatch * tokens * width * ELEMENT_BYTES[amp.model_dtype])


def point_to_point_seconds(size: float, preset: Preset, ranks: int, after_s: float = 0.0) -> float:
    """One send of `size` bytes to the next rank: one hop (the broadcast's between two ranks), between nodes where
    the pipeline spans them (its slowest boundary). One send a boundary, nothing else of the node crossing at once:
    it is given the node's link (over one Ethernet port, all of it; with a NIC a GPU it would get one NIC's, which
    the presets do not tell apart: links.node_share splits the link among groups that cross together). `after_s`:
    the compute before it, which this machine's link adds a cost for (Link.added_after)."""
    nodes = 1 if ranks <= preset.devices_per_node else 2
    return collective_seconds("broadcast", size, 2 if nodes == 1 else 1, nodes, preset.intra, preset.inter,
                              preset.per_op, after_s=after_s)


def sharded_stage_seconds(stage_params: float, stage_grads: float, replicas: int, gathers: int, preset: Preset) -> float:
    """FSDP x PP: a stage sharded over `replicas` pipelines (consecutive ranks, one unit a stage) gathers its
    parameters `gathers` times a step (before each microbatch's forward, and its backward when resharded) and
    reduce-scatters its gradients once, after the last microbatch; nothing to prefetch behind within a stage of one
    unit, so all of it is waited for."""
    if replicas < 2:
        return 0.0
    per_node = min(replicas, preset.devices_per_node)
    nodes = -(-replicas // per_node)
    gather = collective_seconds("all_gather", stage_params, per_node, nodes, preset.intra, preset.inter, preset.per_op)
    scatter = collective_seconds("reduce_scatter", stage_grads, per_node, nodes, preset.intra, preset.inter,
                                 preset.per_op)
    return gathers * gather + scatter


def step_seconds(microbatch_s: float, traffic: Traffic, ranks: int) -> float:
    """The slowest rank's forward and backward of every microbatch, with the schedule's idle share around them."""
    return microbatch_s * traffic.microbatches / (1 - pipeline_bubble(traffic, ranks))


def sends_seconds(size: float, preset: Preset, traffic: Traffic, ranks: int, microbatch_s: float = 0.0) -> float:
    """Each microbatch's activations forward and gradient back across a boundary, waited for (a stage cannot start
    a microbatch it has not received): two hops a microbatch on the slowest rank's path, each after a pass of the
    stage's (half of `microbatch_s`, its forward and backward, on average)."""
    if ranks < 2:
        return 0.0
    return 2 * traffic.microbatches * point_to_point_seconds(size, preset, ranks, after_s=microbatch_s / 2)


def describe(traffic: Traffic, ranks: int, blocks: list[int], schedule: str) -> str:
    bubble = pipeline_bubble(traffic, ranks)
    return (f"pipeline: {ranks} ranks of {blocks} blocks ({schedule}), {traffic.microbatches} microbatches; each "
            f"stage predicted as the model at its block count (what the model uses before its first block on the "
            f"first rank, the rest outside the blocks on the last), the step as the slowest rank's microbatches over 1 - the bubble ({bubble:.0%} idle); "
            "each rank's microbatches (interleaved: chunks) in flight as torch's schedule runs them")


__all__ = ["NotAPipelineModel", "StageBytes", "before_blocks_share", "boundary_bytes", "describe", "in_flight", "model_layers", "rank_blocks", "receive_buffers",
           "sends_seconds", "stage_bytes", "stage_config", "step_seconds"]
