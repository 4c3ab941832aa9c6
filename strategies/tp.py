"""Tensor parallelism (Megatron-style): every block's weights split across all ranks, one process per device.

The model declares how (`tp_plan(sequence_parallel)`, module name -> torch's ParallelStyle; harness/rank/gpt.py's
GPT does): q, k, v and the MLP's up projections split by output features (`ColwiseParallel`), the attention's output
and the MLP's down projection by input features (`RowwiseParallel`), so each rank computes 1/N of the heads and of
the MLP's hidden width, and each block's attention and MLP end in one all-reduce of its activations, in forward and
again in backward. `sequence_parallel=true` also splits the norms and the residual stream between them along the
sequence (`SequenceParallel`): each all-reduce becomes a reduce-scatter after the projection and an all-gather before
the next, and the norms' activations are held 1/N a rank. What is not in the plan (embeddings, final norm, head)
stays whole on every rank.

Every rank of a tensor-parallel group must see the same batch: the group reads one share of the global batch
(`Placement.batch_group`, from `Traffic.tensor_parallel`), as torchtitan's data loader does for its data-parallel
ranks: the whole batch, as one device would, when the group is the world.

Built with `torch.distributed.tensor.parallel.parallelize_module` on a 1-D mesh of the world in the `shard` phase,
before the optimizer; FSDP x TP (strategies.fsdp, `strategy.tp`) uses the same pieces on a 2-D mesh."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

from amp import Amp, AmpSpec
from harness.core.checkpointing import split_model_options
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.errors import ConfigError, Incompatible
from harness.core.traffic import Collective, Traffic
from strategies.base import AmpRule, ProcessGroupStrategy, unwrap

PLAN_DOC = "a model with tp_plan() (docs/workloads.md)"


class SectionedColwise(ColwiseParallel):
    """ColwiseParallel for a Linear whose output is several sections side by side (fused q|k|v, SwiGLU's gate|up):
    each rank gets its 1/N of every section, not 1/N of the fused rows (which would hand one rank all of q). The rows
    are reordered before being split (rank 0's slice of each section, then rank 1's, ...); the module keeps
    `tp_sections` so that `full_parameters` puts them back in the model's own order."""

    def __init__(self, sections: Sequence[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sections = tuple(sections)

    def _partition_linear_fn(self, name: str, module: nn.Module, device_mesh: DeviceMesh) -> None:
        if isinstance(module, nn.Linear) and not hasattr(module, "tp_sections"):
            order = interleaved(self.sections, device_mesh.size())
            for pname, param in list(module.named_parameters(recurse=False)):
                module.register_parameter(pname, nn.Parameter(param.detach()[order], param.requires_grad))
            module.tp_sections = (self.sections, device_mesh.size())  # type: ignore[assignment]
        super()._partition_linear_fn(name, module, device_mesh)


def interleaved(sections: Sequence[int], degree: int) -> torch.Tensor:
    """Row indices: rank 0's contiguous 1/degree of each section in turn, then rank 1's, ... (each section divides)."""
    starts = [sum(sections[:i]) for i in range(len(sections))]
    return torch.cat([torch.arange(start + r * size // degree, start + (r + 1) * size // degree)
                      for r in range(degree) for start, size in zip(starts, sections, strict=True)])


def gathered_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (DTensors gathered: every rank must call this, in the same order), the sectioned
    projections' rows back in the model's order: what one device would hold, on the CPU in float32."""
    inner = unwrap(model)
    full = {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().cpu().clone()
            for name, p in inner.named_parameters()}
    for prefix, module in inner.named_modules():
        sections = getattr(module, "tp_sections", None)
        if sections is None:
            continue
        order = interleaved(*sections)
        for pname, _ in module.named_parameters(recurse=False):
            key = f"{prefix}.{pname}" if prefix else pname
            restored = torch.empty_like(full[key])
            restored[order] = full[key]
            full[key] = restored
    return full


def parallelize(model: nn.Module, mesh: DeviceMesh, sequence_parallel: bool, held: contextlib.ExitStack) -> nn.Module:
    """The model's plan applied on `mesh`; torch's loss_parallel held in `held` (until the strategy's teardown), so
    that a head split by vocabulary (the model's `vocab_parallel`) has its cross-entropy, forward and backward,
    taken on the logits' shards: the context swaps DTensor's handlers for those ops, process-wide."""
    parallel = parallelize_module(model, mesh, model.tp_plan(sequence_parallel))  # type: ignore[operator]
    if getattr(model, "vocab_parallel", False):
        held.enter_context(loss_parallel())
    return parallel


def check_tp_model(cfg: RunConfig, degree: int, sequence_parallel: bool, key: str) -> None:
    """Before launch: the model declares a plan, and what it splits divides by the degree (one line naming the
    key). `key` is the option that set the degree, for the message."""
    from hydra.utils import get_object

    target = get_object(str(cfg.model["_target_"]))
    if not callable(getattr(target, "tp_plan", None)):
        raise Incompatible("model", cfg.model_name, f"{PLAN_DOC} with {key}: this model declares no plan of "
                           "which weights to split")
    sizes = getattr(target, "tp_sizes", None)
    own = split_model_options(cfg.model)[0]  # without the harness's `checkpoint`, which the factory never takes
    options = {k: v for k, v in own.items() if not k.startswith("_")}  # the model's keywords, as Hydra's
    for name, size in (sizes(options, sequence_parallel) if callable(sizes) else {}).items():
        if size % degree:
            raise Incompatible(name, size, f"a multiple of the {degree} tensor-parallel ranks ({key}): each rank "
                               f"computes 1/{degree} of them")


def tp_traffic(sequence_parallel: bool) -> tuple[Collective, ...]:
    """Per block, every micro-batch, as torch's DTensor issues them (counted by CommDebugMode in
    tests/test_tp.py): without sequence parallelism two all-reduces of its activations in forward (after the
    attention, after the MLP) and two in backward (their inputs' gradients); with it, in forward an all-gather before
    each and a reduce-scatter after, in backward an all-gather of each output's gradient and an all-reduce of each
    input's (DTensor reduces the partial gradient whole). None can hide: the next layer waits for them. A
    checkpointed block's recomputation runs its forward's again up to the last one backward needs: the all-reduce
    after the attention (not the MLP's, which ends the block); with sequence parallelism both all-gathers and the
    attention's reduce-scatter. Sequence parallelism also leaves the norms' parameters whole on every rank, each
    gradient a partial sum over the sequence's shards: one all-reduce a parameter, once a step (in the optimizer's
    step; under FSDP x TP in FSDP's reduction)."""
    def per_block(op: str, recomputed: int = 0, residual: bool = False) -> Collective:  # recomputed: a forward's,
        # under checkpointing; residual: on the residual stream, in the model's dtype (the norms' outputs gathered,
        # the blocks' inputs' gradients reduced), not the projections' (their outputs, their outputs' gradients)
        return Collective(op, "activations", "none", group="tp", every="micro_batch", calls="per_block", count=2,
                          recomputed=recomputed, residual=residual)

    if not sequence_parallel:
        return per_block("all_reduce", 1), per_block("all_reduce", residual=True)
    return (per_block("all_gather", 2, residual=True), per_block("reduce_scatter", 1), per_block("all_gather"),
            per_block("all_reduce", residual=True),
            Collective("all_reduce", "whole_grads", "none", group="tp", calls="per_param"))


TP_AMP_RULES = (
    AmpRule({"impl": "apex"}, "impl", "native with tensor parallelism (apex's amp.initialize patches the model and "
            "its optimizer, whose weights become DTensor slices)"),
    AmpRule({"level": ("O2", "O3")}, "level", "O0 or O1 with tensor parallelism (O2/O3 cast the model and keep "
            "fp32 masters beside its DTensor slices: not verified yet)"),
    AmpRule({"loss_scale": "dynamic"}, "loss_scale", "a fixed scale or amp.dtype=bfloat16 with tensor parallelism "
            "at {level} (the scaler's overflow check over a mix of DTensor and plain gradients is not verified)"),
)


class TensorParallel(ProcessGroupStrategy):
    """`parallelize_module` over every rank with the model's own plan (1-D mesh of the world)."""

    shards = (True, True, True)  # the blocks' weights, their gradients and state; embeddings and norms stay whole
    amp_rules = TP_AMP_RULES

    def __init__(self, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel
        self._mesh: DeviceMesh | None = None
        self._held = contextlib.ExitStack()  # loss_parallel, from `shard` to `teardown`

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        super().check_run(cfg, placement, amp)
        if cfg.compile:
            raise ConfigError("compile", True, "false with strategy=tp (compiling tensor-parallel blocks is not "
                              "measured yet)")
        check_tp_model(cfg, placement.world_size, bool(cls.options_of(cfg.strategy)["sequence_parallel"]),
                       "strategy=tp over every rank")

    @classmethod
    def variant(cls, options: Mapping[str, Any]) -> str:
        return "sequence_parallel" if cls.options_of(options)["sequence_parallel"] else ""

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """The activations' collectives per block over the world (the tp group), priced by the planner from the
        model's `tp_activations`; the blocks' weights, gradients and state split over the world."""
        sequence = bool(cls.options_of(options)["sequence_parallel"])
        return Traffic(tp_traffic(sequence), tensor_parallel=0, sequence_parallel=sequence)  # 0: the world

    def shard(self, model: nn.Module, amp: Amp) -> nn.Module:
        """The model's plan applied on the world's mesh: its blocks' Linears become DTensor slices, before the
        optimizer is built over them."""
        self._mesh = init_device_mesh(self.ops.accelerator, (dist.get_world_size(),), mesh_dim_names=("tp",))
        return parallelize(model, self._mesh, self.sequence_parallel, self._held)

    def teardown(self) -> None:
        self._held.close()
        super().teardown()

    def wrap(self, model: nn.Module) -> nn.Module:
        """Nothing to wrap: the plan made the blocks' weights DTensor slices in place, in `shard`; the group's ranks
        read the same share of the batch (`Placement.batch_group`)."""
        return model

    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return gathered_parameters(model)
