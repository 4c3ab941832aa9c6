"""Pipeline parallelism: `torch.distributed.pipelining`, the model cut at its blocks into one stage per rank (two
with `schedule=interleaved_1f1b`), one process per device.

The model is traced once on a microbatch (`torch.distributed.pipelining.pipeline`, torch.export underneath) and
split before the blocks that begin each stage: the first stage holds what comes before the first block (the
embeddings), the last what comes after the last (the final norm and the head); the schedule's `loss_fn` is the
model's own loss, taken on the last stage. Stage i is on rank i (interleaved: stages r and r + world on rank r, as
torch's looped schedules number them), and each rank keeps only its stages' parameters: the optimizer is built over
those (the cut is the `shard` phase). Blocks that do not divide evenly are split as evenly as possible (the first
stages take one block fewer), and the run's notes say so.

There is one copy of the model, so the pipeline trains the whole global batch: each rank's data shard is
all-gathered at the start of every step (token ids: a few kilobytes), so that the first stage feeds and the last
stage scores the batch `single` trains, in the same order. The schedule cuts it into `microbatches`, runs forward and
backward itself (`PipelineSchedule`, the capability the trainer asks for), and scales the gradients by the
microbatches' count, so the update is the batch's mean as without pipelining. The loss is the last stage's mean over
the microbatches, broadcast to every rank so that each records the same losses.

Refused, each in one line before anything starts: amp O2/O3 (the amp plugin casts the whole model and keeps fp32
masters of every parameter before it is cut), loss scaling (each stage's scaler would decide on its own gradients
whether to skip a step, and the stages could disagree), apex, `grad_accum` > 1 (the microbatches are the
accumulation), `compile=true` (the stages are already traced graphs; compiling them is not wired), and a model the
cut cannot make stages of (`check_cuttable`, on the model built on the meta device): one that names no blocks, one
that is not a token model (the trace needs a microbatch of its inputs: `seq_len` token ids), one of fewer blocks than
stages, and one whose stages would share a weight (tied embeddings: the head on the last stage using the first
stage's embedding)."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    SplitPoint,
    pipeline,
)

from amp import Amp, AmpSpec
from harness.core.checkpointing import mode_of
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.errors import ConfigError, Incompatible
from harness.core.inputs import loss_for
from harness.core.traffic import Collective, Traffic
from strategies.base import AmpRule, ProcessGroupStrategy, RankEnv, unwrap
from strategies.capabilities import PipelineSchedule

ScheduleName = Literal["gpipe", "1f1b", "interleaved_1f1b"]
SCHEDULES: dict[str, Any] = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
                             "interleaved_1f1b": ScheduleInterleaved1F1B}
log = logging.getLogger(__name__)
STAGES_PER_RANK = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2}


def block_ranges(blocks: int, stages: int) -> list[range]:
    """Block indices of each stage, as even as possible: the last stages take the extra blocks (the first holds the
    embeddings, the last the head: a middle-or-later stage is where a spare block costs least)."""
    return [range(k * blocks // stages, (k + 1) * blocks // stages) for k in range(stages)]


def declared_blocks(model: nn.Module) -> list[str] | None:
    """The blocks the model names itself (`block_names()`), in order; None where it names none."""
    declared = getattr(unwrap(model), "block_names", None)
    return list(declared()) if callable(declared) else None


class PipelineStages(PipelineSchedule, nn.Module):
    """This rank's stage modules and the schedule that runs them: what the trainer trains. Its parameters are the
    stages' only, under the whole model's names (the trace keeps them), so the optimizer, the parameters held and
    the memory theory see one stage's share."""

    def __init__(self, stages: Sequence[PipelineStage], schedule: Any, loss_of: Any, first: bool, last: bool,
                 last_rank: int, device: torch.device, group: dist.ProcessGroup | None = None,
                 replicas: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stage.submod for stage in stages)
        self.stage_indices = [stage.stage_index for stage in stages]
        self._schedule, self._loss_of, self._first, self._last = schedule, loss_of, first, last
        self._last_rank, self._device = last_rank, device  # the last stage's global rank, in this rank's pipeline
        self._group, self._replicas = group, replicas  # the pipeline's ranks (None: the world); the pipelines'

    def forward(self, *args: Any) -> Any:
        raise RuntimeError("strategy=pp: a pipeline runs through its schedule (forward_backward), not a forward")

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The model's own loss (harness.core.inputs.loss_for finds it here): what the last stage's schedule takes."""
        return self._loss_of(outputs, targets)  # type: ignore[no-any-return]

    def forward_backward(self, batch: tuple[torch.Tensor, torch.Tensor], amp: Amp) -> torch.Tensor:
        """One schedule step over the global batch: the shards gathered, the first stage fed, the last scored; the
        microbatches' mean loss from the last stage, on every rank."""
        inputs, targets = (self._whole(t) for t in batch)
        losses: list[torch.Tensor] = []
        last = self._last
        with amp.forward_context():
            self._schedule.step(*((inputs,) if self._first else ()), target=targets if last else None,
                                losses=losses if last else None, return_outputs=False)
        loss = torch.stack([v.detach().float() for v in losses]).mean() if last \
            else torch.zeros((), dtype=torch.float32, device=self._device)
        dist.broadcast(loss, src=self._last_rank, group=self._group)
        if self._replicas is not None:  # each pipeline scored its share of the batch: the batch's mean
            dist.all_reduce(loss, group=self._replicas)
            loss /= dist.get_world_size(self._replicas)
        return loss

    def _whole(self, shard: torch.Tensor) -> torch.Tensor:
        """The shards of the pipeline's ranks, in rank order: its batch (the data is sharded by rank; one
        pipeline: the global batch)."""
        parts = [torch.empty_like(shard) for _ in range(dist.get_world_size(self._group))]
        dist.all_gather(parts, shard.contiguous(), group=self._group)
        return torch.cat(parts)


class Pipeline(ProcessGroupStrategy):
    amp_rules = (
        AmpRule({"impl": "apex"}, "impl", "native with strategy=pp (apex's amp.initialize patches the whole model "
                "and its optimizer, which the pipeline replaces by one stage's)"),
        AmpRule({"cast_model": True}, "level", "O0 or O1 with strategy=pp (O2/O3 cast the whole model and keep "
                "fp32 masters of every parameter before it is cut into stages: not wired)"),
        AmpRule({"loss_scale": "dynamic"}, "loss_scale", "amp.dtype=bfloat16 or amp.loss_scale=1 with strategy=pp "
                "at {level}: each stage's scaler would decide on its own gradients whether to skip a step"),
    )

    def __init__(self, schedule: ScheduleName = "1f1b", microbatches: int = 4) -> None:
        super().__init__()
        self.schedule, self.microbatches = schedule, microbatches
        self._env: RankEnv | None = None

    # ---- the parent's side ----

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        super().check_run(cfg, placement, amp)
        o = cls.options_of(cfg.strategy)
        check_schedule(cfg, amp, o["schedule"], o["microbatches"], placement.world_size, placement.global_batch,
                       "strategy=pp")

    @classmethod
    def check_built(cls, cfg: RunConfig, placement: Placement, model: nn.Module) -> None:
        check_cuttable(cfg, cls.options_of(cfg.strategy)["schedule"], placement.world_size, model)

    @classmethod
    def variant(cls, options: Mapping[str, Any]) -> str:
        o = cls.options_of(options)
        return f"schedule={o['schedule']} microbatches={o['microbatches']}"

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """Per microbatch, each stage boundary sends its activations forward and their gradient back
        (point-to-point, b_micro x sequence x width); the bubble is the schedule's (harness.core.traffic's
        `pipeline_bubble`). The planner predicts each rank's stage as a model of its own
        (harness.prediction.pipeline)."""
        o = cls.options_of(options)
        return Traffic(pipeline_sends(), microbatches=o["microbatches"], stages_per_rank=STAGES_PER_RANK[o["schedule"]])

    # ---- in the rank ----

    def setup(self, env: RankEnv) -> None:
        super().setup(env)
        self._env = env

    def shard(self, model: nn.Module, amp: Amp) -> nn.Module:
        """The cut over every rank (one pipeline): the model traced on one microbatch of the global batch, split
        before each stage's first block, this rank's stages built; the rest of the model is dropped, so the optimizer
        is built over this rank's stages alone."""
        env = self._env
        assert env is not None
        return cut(model, self.schedule, self.microbatches, env.placement.global_batch, self.device,
                   ranks=list(range(env.world_size)), rank=env.rank)

    def wrap(self, model: nn.Module) -> nn.Module:
        """Nothing to wrap: the stages and their schedule were built in `shard`."""
        return model

    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Every stage's parameters gathered from every rank (all ranks must call it), by the whole model's names,
        in stage order: the model as `single` trains it."""
        return stage_parameters(model)


def stage_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every stage's parameters, whole (a stage sharded by FSDP gathered over its replicas: DTensor.full_tensor), from
    every rank (all must call it, in the same order), by the whole model's names, in stage order."""
    from torch.distributed.tensor import DTensor

    stages = unwrap(model)
    assert isinstance(stages, PipelineStages)
    own = {index: {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().cpu().clone()
                   for n, p in stage.named_parameters()}
           for index, stage in zip(stages.stage_indices, stages.stages, strict=True)}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, own)
    by_stage = {index: params for held in gathered for index, params in held.items()}
    return {name: tensor for index in sorted(by_stage) for name, tensor in by_stage[index].items()}


def pipeline_sends() -> tuple[Collective, ...]:
    """Each stage boundary's activations sent forward and their gradient back, every microbatch."""
    return (Collective("send_recv", "stage_activations", "forward", every="micro_batch"),
            Collective("send_recv", "stage_activations", "backward", every="micro_batch"))


def check_schedule(cfg: RunConfig, amp: AmpSpec, schedule: str, micro: int, ranks: int, batch: int,
                   name: str) -> None:
    """Before launch: a pipeline of `ranks` ranks training `batch` sequences a step can run this schedule and these
    microbatches; what a pipeline cannot run besides (`name`: the strategy, for the messages)."""
    if micro < 1 or batch % micro:
        raise ConfigError("strategy.microbatches", micro, f"a divisor of the pipeline's batch of {batch} (the "
                          "pipeline trains its whole batch, cut into this many microbatches)")
    if schedule == "1f1b" and micro < ranks:
        raise ConfigError("strategy.microbatches", micro, f"at least the {ranks} stages with strategy.schedule="
                          "1f1b (torch's Schedule1F1B refuses fewer)")
    rounds = max(1, micro // ranks)
    if schedule == "interleaved_1f1b" and micro % rounds:
        raise ConfigError("strategy.microbatches", micro, f"a multiple of {rounds} with strategy.schedule="
                          f"interleaved_1f1b on {ranks} ranks (torch runs the microbatches in max(1, microbatches"
                          f" // ranks) = {rounds} equal rounds)")
    if cfg.grad_accum > 1:
        raise Incompatible("grad_accum", cfg.grad_accum, f"1 with {name}: the schedule's microbatches "
                           "(strategy.microbatches) are its gradient accumulation")
    checkpoint = mode_of("model.checkpoint", cfg.model.get("checkpoint", "none"))
    if checkpoint != "none":  # measured: a 4-block GPT's stages peaked at 11.6 MiB with it, 11.5 without
        raise Incompatible("model.checkpoint", checkpoint, f"none with {name}: the pipeline's trace "
                           "(torch.export, under torch.distributed.pipelining.pipeline) inlines the blocks' "
                           "checkpointing, so the stages would keep every activation anyway")
    if cfg.compile:
        raise Incompatible("compile", True, f"false with {name}: its stages are traced graphs run by the "
                           "schedule; compiling them is not wired")
    if amp.loss_scale not in ("dynamic", 1.0, 1):
        raise Incompatible("amp.loss_scale", amp.loss_scale, f"1 with {name}: the schedule runs backward "
                           "itself, on the unscaled loss")


def cut(model: nn.Module, schedule: str, microbatches: int, batch: int, device: torch.device, ranks: Sequence[int],
        rank: int, group: dist.ProcessGroup | None = None, replicas: dist.ProcessGroup | None = None,
        prepare: Callable[[nn.Module], nn.Module] = lambda stage: stage) -> PipelineStages:
    """The model cut into `STAGES_PER_RANK[schedule] x len(ranks)` stages at its blocks, stage i on `ranks[i % p]`
    (the pipeline's ranks, global numbers, in stage order; `group` their process group, None for the world), traced
    on one microbatch of the pipeline's `batch`; `prepare` is applied to each of this rank's stage modules before its
    stage is built (FSDP x PP: fully_shard over the pipelines of the same stage, `replicas`)."""
    p = len(ranks)
    position = ranks.index(rank)
    blocks = declared_blocks(model)
    assert blocks is not None  # refused before launch otherwise (check_cuttable)
    n_stages = STAGES_PER_RANK[schedule] * p
    if len(blocks) < n_stages:  # refused before launch (check_cuttable): kept for a model built otherwise
        raise ValueError(f"strategy=pp: {len(blocks)} blocks cannot make {n_stages} stages (schedule="
                         f"{schedule} on {p} ranks): a model of more blocks, or fewer ranks")
    note = split_note(len(blocks), n_stages)
    if note and rank == 0:
        log.warning(note)
    starts = [r.start for r in block_ranges(len(blocks), n_stages)[1:]]
    example = torch.zeros(batch // microbatches, unwrap(model).seq_len, dtype=torch.long, device=device)
    pipe = pipeline(model, mb_args=(example,), split_spec={blocks[s]: SplitPoint.BEGINNING for s in starts})
    shared = shared_parameters([pipe.get_stage_module(i) for i in range(n_stages)])
    if shared:  # refused before launch where the meta forward saw it (check_cuttable); the trace's word is final
        raise ValueError(f"strategy=pp: {shared[0]} is used by more than one stage (tied weights, e.g. model."
                         "tie_embeddings=true): each stage would train its own copy; untie them")
    mine = [position + k * p for k in range(STAGES_PER_RANK[schedule])]
    for i in mine:
        prepare(pipe.get_stage_module(i))
    stages = [pipe.build_stage(i, device, group=group) for i in mine]
    # each stage keeps the pipeline's graph, and the graph the module holding every stage: the others' go
    others = {id(pipe.get_stage_module(i)) for i in range(n_stages) if i not in mine}
    for name, child in list(pipe.split_gm.named_children()):
        if id(child) in others:
            delattr(pipe.split_gm, name)
    loss_of = loss_for(detached_loss_owner(model))
    del pipe, model  # the rest of the model goes with them: this rank holds its stages alone
    schedule_cls = SCHEDULES[schedule]
    runner = schedule_cls(stages, microbatches, loss_fn=loss_of) if len(stages) > 1 \
        else schedule_cls(stages[0], microbatches, loss_fn=loss_of)
    last = (n_stages - 1) % p
    return PipelineStages(stages, runner, loss_of, first=position == 0, last=position == last,
                          last_rank=ranks[last], device=device, group=group, replicas=replicas)


def check_cuttable(cfg: RunConfig, schedule: str, world: int, built: nn.Module) -> None:
    """Before launch, on the model as built on the meta device (harness.launch.model_check's, which the launch
    hands to `check_built`): the model names its blocks, takes token ids, has at least one block for each
    of the `STAGES_PER_RANK[schedule] * world` stages, and uses no weight on two stages. Each refused in one line,
    naming the model's own key where it has one (model=gpt's `model.layers`, `model.tie_embeddings`)."""
    from harness.core.checkpointing import split_model_options

    model = unwrap(built)
    blocks = declared_blocks(model)
    if blocks is None:
        raise Incompatible("strategy", "pp", "a model that names its blocks: strategy=pp cuts the model into "
                           "stages at them (add a block_names() method returning the blocks' module names, "
                           "in order, as harness/rank/gpt.py's GPT does)")
    if not isinstance(getattr(model, "seq_len", None), int):
        raise Incompatible("strategy", "pp", "a token model (with seq_len, as model=gpt): strategy=pp traces "
                           "the model on a microbatch of token ids")
    own = split_model_options(cfg.model)[0]  # the factory's keywords (without the harness's `checkpoint`)
    per = STAGES_PER_RANK[schedule]
    n_stages = per * world
    if len(blocks) < n_stages:
        most = len(blocks) // per
        fewer = f"at most {most} rank{'s' * (most > 1)}" if most else "strategy.schedule=gpipe or 1f1b (one stage a rank)"
        cut = f"strategy=pp on {world} rank{'s' * (world > 1)} (strategy.schedule={schedule} cuts {n_stages} " \
              f"stages{f', {per} a rank' if per > 1 else ''}, each of at least one block"
        if own.get("layers") == len(blocks):
            raise Incompatible("model.layers", len(blocks), f"at least {n_stages} with {cut}), or {fewer}")
        raise Incompatible("model", cfg.model_name, f"a model of at least {n_stages} blocks with {cut}; its "
                           f"block_names() names {len(blocks)}), or {fewer}")
    shared = shared_across_stages(model, blocks, n_stages) if n_stages > 1 else None
    if shared is not None:
        name, first, last = shared
        if own.get("tie_embeddings") is True:
            raise Incompatible("model.tie_embeddings", True, "false with strategy=pp: the head would share the "
                               f"embedding's weight across the first and last stages, each training its own copy "
                               f"({name}, used by stages {first} and {last})")
        raise Incompatible("model", cfg.model_name, f"a model whose stages share no weight with strategy=pp: {name} "
                           f"is used by stages {first} and {last}, each of which would train its own copy (tied "
                           "weights): untie it")


def shared_across_stages(model: nn.Module, blocks: Sequence[str], n_stages: int) -> tuple[str, int, int] | None:
    """A parameter the cut would put on two stages, and the first two stages that use it; None if none (or if the
    forward cannot run on the model as it is: the cut itself checks again). One forward without gradients on a
    microbatch of one sequence, on the device the model is on (the meta device before launch: nothing computed),
    each parameter's uses placed as the trace places them: before the first block on the first stage, in or after
    block i (up to the next stage's first block) on block i's stage."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves

    stage_of = {i: k for k, r in enumerate(block_ranges(len(blocks), n_stages)) for i in r}
    names = {id(p): name for name, p in model.named_parameters()}
    uses: dict[str, list[int]] = {}
    where = [0]

    class Uses(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            for leaf in tree_leaves((args, kwargs or {})):
                name = names.get(id(leaf)) if isinstance(leaf, nn.Parameter) else None
                if name is not None and where[0] not in uses.setdefault(name, []):
                    uses[name].append(where[0])
            return func(*args, **(kwargs or {}))

    modules = dict(model.named_modules())
    handles = [modules[block].register_forward_pre_hook(lambda *_, k=stage_of[i]: where.__setitem__(0, k))
               for i, block in enumerate(blocks) if block in modules]
    device = next((p.device for p in model.parameters()), torch.device("meta"))
    try:
        with torch.no_grad(), Uses():
            model(torch.zeros(1, model.seq_len, dtype=torch.long, device=device))
    except Exception as error:  # noqa: BLE001 (a forward the meta device cannot run: the cut decides)
        log.debug("strategy=pp: the stages' weights were not checked before launch: %s", error)
        return None
    finally:
        for handle in handles:
            handle.remove()
    for name, stages in uses.items():
        if len(stages) > 1:
            return name, *sorted(stages)[:2]
    return None


def detached_loss_owner(model: nn.Module) -> nn.Module:
    """A copy of the model without its submodules, parameters or buffers, for its own `loss` to be bound to: a
    model's loss reads its settings (GPT's `loss_chunks`), and a loss bound to the model itself would keep every
    stage's parameters alive on every rank. A loss that needs a layer fails at the first step, naming it."""
    owner = copy.copy(unwrap(model))
    owner._modules, owner._parameters, owner._buffers = {}, {}, {}
    return owner


def shared_parameters(stages: Sequence[nn.Module]) -> list[str]:
    """Parameters the trace put in more than one stage (a weight the model uses in two places, as tied embeddings):
    each stage would step a copy of its own."""
    seen: dict[str, int] = {}
    for stage in stages:
        for name, _ in stage.named_parameters():
            seen[name] = seen.get(name, 0) + 1
    return [name for name, count in seen.items() if count > 1]


def split_note(blocks: int, stages: int) -> str | None:
    """What the notes say of an uneven split (None when even)."""
    if blocks % stages == 0:
        return None
    sizes = [len(r) for r in block_ranges(blocks, stages)]
    return f"strategy=pp: {blocks} blocks over {stages} stages split as evenly as possible ({sizes}): " \
           f"the slowest stage sets the pace ({math.ceil(blocks / stages)} blocks)"
