"""FSDP2: `torch.distributed.fsdp.fully_shard` on each block and on the root, one process per device.

Parameters, gradients and optimizer state are sharded across ranks (each rank keeps 1/N of each, as
DTensors); a block's parameters are all-gathered before its forward and again before its backward
(`reshard_after_forward=true`; false keeps them gathered from forward to backward: more memory, one
all-gather less), and its gradients are reduce-scattered after its backward. The optimizer is built
after sharding, over the sharded parameters: sharding is the `shard` phase, before the optimizer's.

Precision: FSDP2's `MixedPrecisionPolicy`, with the dtypes the amp plugin gives
(`Amp.sharded_precision`), replaces the plugin's casting where a faithful mapping of apex's level exists (torch's own gradient scaler is kept, and works on DTensor gradients: DTensor's
dispatcher all-reduces its overflow flag, torch/distributed/tensor/_dispatch.py
`aten._amp_foreach_non_finite_check_and_unscale_.default: found_inf_reduce_handler`):

- O0: no policy; fp32 everywhere.
- O1: fp32 sharded parameters, gathered and reduced in fp32; the amp plugin's `torch.autocast` casts per
  op, exactly as under DDP. (`param_dtype` half would cast every weight, batch-norm's included, for the
  whole forward: that is O2/O3's model cast, not O1's per-op casting.)
- O2: `param_dtype` half (gathered and computed in half), `reduce_dtype` fp32, `output_dtype` fp32. The
  fp32 sharded parameters the optimizer steps are O2's master weights. Batch-norm is kept fp32
  (`keep_batchnorm_fp32`) by making each batch-norm a unit of its own with an fp32 policy that leaves its
  half input as it is: FSDP2's units share one `param_dtype`, so this costs an all-gather and a
  reduce-scatter per batch-norm layer, which is what keeping them fp32 costs here.
- O3 (and O2 with `amp.master_weights=false`): the model is cast to half before sharding, as the amp
  plugin does; no policy: parameters, gradients, their reduction and the optimizer are all half, except
  batch-norm where `keep_batchnorm_fp32` keeps it fp32 (O2's default): each batch-norm is then a unit of
  its own, as under O2, since one unit's parameters must share a dtype.

`replicate=N` (N > 1) is HSDP: a 2-D DeviceMesh (replicate, shard) of N replicas of world/N consecutive ranks,
passed to every `fully_shard` call; parameters are sharded within each shard group and replicated across them, so a
rank holds 1/(world/N) of them. All-gathers and the gradients' reduce-scatter stay within the shard group (one node,
on a cluster); each unit's reduced gradient shard is then all-reduced across the N replicas.

`comm_hook=fp16|bf16` is DDP's gradient compression in FSDP2's terms: `reduce_dtype` half, so the
reduce-scatter moves half the bytes. PowerSGD has no FSDP2 counterpart (fully_shard takes no
communication hook) and is refused. apex's amp (`amp.impl=apex`) patches the model it is given and
cannot be combined with DTensor parameters: refused.

`tp=N` (N > 1) is FSDP x TP, torchtitan's 2-D parallelism: a 2-D DeviceMesh (dp, tp) of world/N groups of N
consecutive ranks; the model's tensor-parallel plan (`tp_plan()`, strategies.tp) is applied on the `tp` dim, then
`fully_shard` shards the resulting DTensor slices over the `dp` dim (torchtitan's order). Each TP group trains on its
data-parallel share of the batch, every rank of it reading the same share (`Placement.batch_group`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from amp import Amp, AmpSpec, ShardedPrecision
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.errors import ConfigError, Incompatible
from harness.core.traffic import Buffer, Collective, Traffic
from strategies.base import AmpRule, ProcessGroupStrategy, RankEnv, unwrap
from strategies.capabilities import GradientSyncControl, ShardedParameters
from strategies.ddp import HOOK_DTYPE, CommHook
from strategies.pp import (
    STAGES_PER_RANK,
    ScheduleName,
    check_cuttable,
    check_schedule,
    cut,
    pipeline_sends,
    stage_parameters,
)
from strategies.tp import TP_AMP_RULES, check_tp_model, gathered_parameters, parallelize, tp_traffic

_BATCHNORM = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)
# FSDP x PP: the pipeline's cut and schedule run on the model as built (strategies.pp's rules), FSDP2's policy casting
# each stage: O2 would need the stages' masters through the schedule's backward, not verified yet
PP_AMP_RULES = (
    AmpRule({"cast_model": True}, "level", "O0 or O1 with strategy.pp (a pipeline of FSDP2 stages at O2/O3 is "
            "not verified yet)"),
)
# FSDP x TP at O2: FSDP2's MixedPrecisionPolicy casts the gathered DTensor slices (torchtitan's bf16 training), so
# only the model cast of O3 (and O2 without masters) and the scaler's mix are left refused, as under strategy=tp
FSDP_TP_AMP_RULES = tuple(r for r in TP_AMP_RULES if r.key != "level") + (
    AmpRule({"level": "O3"}, "level", "O0, O1 or O2 with strategy.tp (O3 casts the model itself before TP slices "
            "it: not verified yet; O2's policy casts the gathered slices instead)"),
    AmpRule({"level": "O2", "master_weights": False}, "master_weights", "true with strategy.tp at O2 (without "
            "masters the model itself is cast, as O3: not verified yet)"),
)
_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}




class FSDP2(ShardedParameters, GradientSyncControl, ProcessGroupStrategy):
    searchable = True
    shards = (True, True, True)
    amp_rules = (AmpRule({"impl": "apex"}, "impl",
                         "native with strategy=fsdp (apex's amp.initialize patches the model and its optimizer, "
                         "which FSDP2 replaces with sharded DTensor parameters)"),)

    def __init__(self, reshard_after_forward: bool = True, blocks: list[str] | None = None,
                 comm_hook: CommHook = "none", replicate: int = 1, tp: int = 1,
                 sequence_parallel: bool = False, pp: int = 1, schedule: ScheduleName = "1f1b",
                 microbatches: int = 4) -> None:
        super().__init__()
        self.reshard_after_forward, self.blocks, self.comm_hook = reshard_after_forward, blocks, comm_hook
        self.replicate = replicate  # 1: FSDP over every rank; N > 1: HSDP, N replicas of world/N shards
        self._root: FSDPModule | None = None
        self._mesh: DeviceMesh | None = None
        self.tp = tp  # 1: no tensor parallelism; N > 1: FSDP x TP on a (world/N, N) mesh
        self._tp_mesh: DeviceMesh | None = None
        self.sequence_parallel = sequence_parallel  # with tp: the norms and residual stream split by sequence too
        self._held = contextlib.ExitStack()  # TP's loss_parallel, from `shard` to `teardown`
        # FSDP x PP: `pp` pipeline stages, each sharded over the world/pp pipelines (strategies.pp's cut)
        self.pp, self.schedule, self.microbatches = pp, schedule, microbatches
        self._env: RankEnv | None = None
        self._precision = ShardedPrecision()

    @classmethod
    def model_notes(cls, options: Mapping[str, Any], model: nn.Module) -> tuple[str, ...]:
        """A model with no blocks is sharded at the root alone: every rank gathers every parameter at once, and
        the run says so."""
        if cls(**cls.options_of(options)).unit_names(model):
            return ()
        return ("strategy=fsdp: the model names no blocks (block_names()) and has no top-level Sequential or "
                "ModuleList, so it is sharded as one unit at the root: each rank gathers all its parameters at once; "
                "strategy.blocks=[...] names the submodules to shard",)

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        super().check_run(cfg, placement, amp)
        options = cls.options_of(cfg.strategy)
        if options["comm_hook"] == "powersgd":
            raise Incompatible("strategy.comm_hook", "powersgd", "none, fp16 or bf16 with strategy=fsdp (FSDP2's "
                               "fully_shard takes no communication hook; fp16/bf16 set its reduce_dtype)")
        replicate, world = options["replicate"], placement.world_size
        if replicate < 1:
            raise ConfigError("strategy.replicate", replicate, "an integer >= 1 (1: FSDP over every rank; N: HSDP, "
                              "N replicas each sharded over world/N ranks)")
        check_divides("strategy.replicate", replicate, world, "HSDP's replicas each shard over world/replicate ranks")
        check_tensor_parallel(cfg, placement, amp, options)
        check_pipeline_parallel(cfg, placement, amp, options)

    @classmethod
    def check_built(cls, cfg: RunConfig, placement: Placement, model: nn.Module) -> None:
        options = cls.options_of(cfg.strategy)
        if options["pp"] > 1:
            check_cuttable(cfg, options["schedule"], options["pp"], model)

    @classmethod
    def variant(cls, options: Mapping[str, Any]) -> str:
        options = cls.options_of(options)
        parts = [f"comm_hook={options['comm_hook']}" if options["comm_hook"] != "none" else "",
                 "reshard_after_forward=false" if options["reshard_after_forward"] is False else "",
                 f"blocks={','.join(options['blocks'])}" if options["blocks"] is not None else "",
                 f"replicate={options['replicate']}" if options["replicate"] != 1 else "",
                 f"tp={options['tp']}" if options["tp"] != 1 else "",
                 "sequence_parallel" if options["tp"] != 1 and options["sequence_parallel"] else "",
                 f"pp={options['pp']} schedule={options['schedule']} microbatches={options['microbatches']}"
                 if options["pp"] != 1 else ""]
        return " ".join(p for p in parts if p)

    @classmethod
    def lossy(cls, options: Mapping[str, Any]) -> str | None:
        hook = cls.options_of(options)["comm_hook"]
        return f"comm_hook={hook}: gradients are reduced in {hook} (reduce_dtype)" if hook != "none" else None

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """Each unit's parameters all-gathered before its forward (prefetched: overlapped), again before its
        backward when resharded after forward, for every micro-batch; its gradients reduce-scattered during the
        last micro-batch's backward (accumulation keeps them unsharded until then: no_sync). Held:
        the gathered unit and the next one prefetched, and one unit's unsharded gradients. HSDP (replicate > 1):
        the gathers and the reduce-scatter within the shard group, then each unit's reduced gradient shard
        all-reduced across the replicas, also under backward (FSDP2 reduces in reduce_dtype throughout)."""
        o = cls.options_of(options)
        if o["pp"] > 1:  # FSDP x PP: the pipeline's sends, and each stage (one unit) gathered and reduced over
            # the pipelines holding it
            stage = (Collective("all_gather", "params", "none", group="dp", every="micro_batch"),
                     Collective("reduce_scatter", "grads", "none", group="dp"))
            return Traffic((*pipeline_sends(), *stage), microbatches=o["microbatches"],
                           stages_per_rank=STAGES_PER_RANK[o["schedule"]], pipeline_ranks=o["pp"])
        replicate, dtype = o["replicate"], HOOK_DTYPE.get(o["comm_hook"])
        group = "shard" if replicate > 1 else "world"
        gathers = (Collective("all_gather", "params", "forward", group=group, every="micro_batch"),)
        if o["reshard_after_forward"]:
            gathers += (Collective("all_gather", "params", "backward", group=group, every="micro_batch"),)
        reduce: tuple[Collective, ...] = (Collective("reduce_scatter", "grads", "backward", dtype, group=group),)
        if replicate > 1:
            reduce += (Collective("all_reduce", "grads", "backward", dtype, group="replicate"),)
        if o["tp"] > 1:  # FSDP x TP: FSDP's collectives within the data-parallel group, TP's activations beside
            retarget = [Collective(c.op, c.payload, c.overlap, c.dtype, group="dp", every=c.every)
                        for c in gathers + reduce]
            return Traffic((*retarget, *tp_traffic(bool(o["sequence_parallel"]))),
                           (Buffer("unit_params", 2), Buffer("unit_grads", 1)),
                           tensor_parallel=o["tp"], sequence_parallel=bool(o["sequence_parallel"]))
        return Traffic(gathers + reduce, (Buffer("unit_params", 2), Buffer("unit_grads", 1)),
                       replicate=max(1, replicate))

    def apply_precision(self, model: nn.Module, amp: Amp) -> nn.Module:
        """The amp plugin says what FSDP2 does in place of its casting (`Amp.sharded_precision`): the model is
        cast only where no policy maps the level (O3, O2 without masters)."""
        self._precision = amp.sharded_precision(_HALF.get(self.comm_hook), model)
        return amp.cast_module(model) if self._precision.cast_model else model

    def shard(self, model: nn.Module, amp: Amp) -> nn.Module:
        """Bottom-up: batch-norm units, then blocks, then the root, each with the policy the amp plugin's
        dtypes make; the optimizer is then built over the sharded parameters."""
        p = self._precision
        policy = MixedPrecisionPolicy(param_dtype=p.param_dtype, reduce_dtype=p.reduce_dtype)
        root_policy = MixedPrecisionPolicy(param_dtype=p.param_dtype, reduce_dtype=p.reduce_dtype,
                                           output_dtype=p.output_dtype)  # O2: the loss in fp32, as apex O2
        # fp32 batch-norm beside half parameters: its own unit, gathering fp32 and taking its input as it comes
        norm_policy = MixedPrecisionPolicy(reduce_dtype=p.reduce_dtype, cast_forward_inputs=False) \
            if p.norms_apart and p.param_dtype is not None else policy
        units = dict.fromkeys(self.unit_names(model))
        if p.norms_apart:
            # fp32 batch-norm in a half block (a ResNet's): FSDP2 asserts one original dtype per unit
            # (_fsdp_param_group.py: "FSDP expects uniform original parameter dtype but got ..."), so each
            # batch-norm is a unit of its own, whether the model was cast (O3) or the policy casts (O2)
            units.update(dict.fromkeys(n for n, m in model.named_modules() if isinstance(m, _BATCHNORM)))
        if self.pp > 1:
            return self._pipelined(model, policy)
        modules = dict(model.named_modules())
        mesh = self.mesh()
        if self._tp_mesh is not None:  # TP first, then FSDP over the data-parallel dim (torchtitan's order)
            model = parallelize(model, self._tp_mesh["tp"], self.sequence_parallel, self._held)
        for name in sorted(units, key=lambda n: -n.count(".") - 1):  # children before their parents
            module = modules[name]
            fully_shard(module, mesh=mesh, mp_policy=norm_policy if isinstance(module, _BATCHNORM) else policy,
                        reshard_after_forward=self.reshard_after_forward)
        self._root = fully_shard(model, mesh=mesh, mp_policy=root_policy,
                                 reshard_after_forward=self.reshard_after_forward)
        return model

    def setup(self, env: RankEnv) -> None:
        super().setup(env)
        self._env = env

    def _pipelined(self, model: nn.Module, policy: MixedPrecisionPolicy) -> nn.Module:
        """FSDP x PP: a (pp, dp) mesh, torchtitan's order (the pipeline's stages the outer dim: rank r holds stage
        r // dp of pipeline r % dp); strategies.pp's cut over this rank's pipeline, each of its stage modules
        fully_shard-ed over the pipelines holding the same stage (one unit a stage) before the stage is built, so
        that the schedule drives FSDP2's gathers and reduce-scatters (torch.distributed.pipelining's stages know
        FSDPModule). Each pipeline trains on its ranks' shares of the batch."""
        env = self._env
        assert env is not None
        world = env.world_size
        dp = world // self.pp
        mesh = init_device_mesh(self.ops.accelerator, (self.pp, dp), mesh_dim_names=("pp", "dp"))
        ranks = [env.rank % dp + k * dp for k in range(self.pp)]

        def prepare(stage: nn.Module) -> nn.Module:
            return fully_shard(stage, mesh=mesh["dp"], mp_policy=policy,
                               reshard_after_forward=self.reshard_after_forward)

        return cut(model, self.schedule, self.microbatches, env.placement.global_batch // dp, self.device, ranks,
                   env.rank, group=mesh["pp"].get_group(), replicas=mesh["dp"].get_group(), prepare=prepare)

    def mesh(self) -> DeviceMesh | None:
        """HSDP's 2-D mesh (replicate, shard), built once over the process group, on the run's device type (cuda,
        or cpu with gloo); None for plain FSDP, whose default mesh is the whole world, as fully_shard builds it,
        and in a process group of one (the planner's calibration of a rank's step: nothing to replicate). Rank r is
        in shard group r // (world/replicate): consecutive ranks, a node's GPUs on a cluster."""
        world = dist.get_world_size()
        if self.tp > 1 and world > 1:  # FSDP x TP: the data-parallel dim of the (dp, tp) mesh (in a process group of
            # one, the planner's calibration of a rank's step, there is nothing to split: plain FSDP)
            if self._tp_mesh is None:
                self._tp_mesh = init_device_mesh(self.ops.accelerator, (world // self.tp, self.tp),
                                                 mesh_dim_names=("dp", "tp"))
            return self._tp_mesh["dp"]
        if self.replicate == 1 or world == 1:
            return None
        if self._mesh is None:
            self._mesh = init_device_mesh(self.ops.accelerator, (self.replicate, world // self.replicate),
                                          mesh_dim_names=("replicate", "shard"))
        return self._mesh

    def wrap(self, model: nn.Module) -> nn.Module:
        """Nothing left to wrap: fully_shard made the model an FSDPModule in place, in `shard`."""
        return model

    def unit_names(self, model: nn.Module) -> list[str]:
        """`blocks` as given; or (null) the blocks the model names itself (`block_names()`: a transformer's
        layers, harness/core/inputs.py's contract); or every child of the model's top-level Sequential and
        ModuleList containers that holds parameters: a torchvision ResNet's residual blocks (layer1.0, ...),
        tiny_cnn's layers."""
        modules = dict(model.named_modules())
        if self.blocks is not None:
            unknown = [b for b in self.blocks if b not in modules or b == ""]
            if unknown:
                raise ValueError(f"strategy.blocks: {unknown[0]} is not a submodule of the model; e.g. "
                                 + ", ".join(n for n, _ in model.named_children()))
            return list(self.blocks)
        declared = getattr(model, "block_names", None)
        if callable(declared):
            return list(declared())
        return [f"{name}.{child}" for name, container in model.named_children()
                if isinstance(container, nn.Sequential | nn.ModuleList)
                for child, module in container.named_children() if any(True for _ in module.parameters())]

    def compile(self, model: nn.Module) -> nn.Module:
        """A model that names its blocks (a transformer, `block_names()`): each block's forward compiled on its
        own, as torchtitan compiles per transformer block: FSDP2's gathers and reduce-scatters stay in the hooks
        around each compiled forward, and one graph serves every block of the same shape. Any other model:
        compiled whole with static shapes (`dynamic=False`). FSDP2's hooks break the graph at each unit, so dynamo
        compiles each block's forward as a frame of its own; a ResNet's blocks share one forward (torchvision's
        BasicBlock.forward) at different widths, and after the second width dynamo's automatic dynamic shapes
        recompiles it with symbolic sizes, whose backward inductor fails on (torch 2.15.0, resnet18 on CPU:
        `InductorError: TypeError: Cannot convert expression to float`). Static shapes compile each width
        apart instead (resnet18: 7 graphs, under dynamo's recompile limit of 8)."""
        blocks = compiled_blocks(model)
        return model if blocks else torch.compile(model, dynamic=False)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return self._gradient_sync_off()

    @contextlib.contextmanager
    def _gradient_sync_off(self) -> Iterator[None]:
        """FSDP2's no_sync: gradients stay unsharded and accumulate; reduce-scatter at the last micro-batch."""
        assert self._root is not None
        self._root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self._root.set_requires_gradient_sync(True)

    def teardown(self) -> None:
        self._held.close()
        super().teardown()

    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Each DTensor gathered whole (an all-gather: every rank must call this, in the same order); TP's sectioned
        projections back in the model's row order; with PP, every stage's from every rank."""
        if self.pp > 1:
            return stage_parameters(model)
        return gathered_parameters(model)


def compiled_blocks(model: nn.Module) -> list[str]:
    """Each block the model names (`block_names()`) gets a compiled forward, in place; returns their names (none:
    the model names no blocks, nothing was done)."""
    declared = getattr(unwrap(model), "block_names", None)
    if not callable(declared):
        return []
    modules = dict(unwrap(model).named_modules())
    for name in declared():
        block = modules[name]
        block.forward = torch.compile(block.forward, dynamic=False)  # type: ignore[method-assign]
    return list(declared())


def sharded_units(model: nn.Module) -> Sequence[str]:
    """The names of the modules fully_shard made units of (for tests and logs)."""
    return [n for n, m in model.named_modules() if isinstance(m, FSDPModule)]


def check_divides(key: str, degree: int, world: int, why: str) -> None:
    """A degree of the mesh divides the ranks; else one line naming them and the divisors allowed."""
    if world % degree:
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        raise Incompatible(key, degree, f"a divisor of the {world} ranks ({', '.join(map(str, divisors))}): {why}")


def check_pipeline_parallel(cfg: RunConfig, placement: Placement, amp: AmpSpec, options: Mapping[str, Any]) -> None:
    """`strategy.pp` before anything starts: a divisor of the ranks, alone (not with tp or replicate: a 3-D mesh),
    a schedule its pipeline's batch and microbatches can run (strategies.pp.check_schedule), at O0 or O1."""
    pp, world = options["pp"], placement.world_size
    if pp < 1:
        raise ConfigError("strategy.pp", pp, "an integer >= 1 (1: no pipeline; N: FSDP x PP, N pipeline stages "
                          "each sharded over world/N ranks)")
    if pp == 1:
        for key, default in (("schedule", "1f1b"), ("microbatches", 4)):
            if options[key] != default:
                raise Incompatible(f"strategy.{key}", options[key], f"{default} with strategy.pp=1 (the pipeline's "
                                   "schedule applies with strategy.pp=N > 1; strategy=pp is a pipeline alone)")
        return
    check_divides("strategy.pp", pp, world, "FSDP shards each of the pp stages over world/pp ranks")
    for key in ("tp", "replicate"):
        if options[key] != 1:
            raise Incompatible("strategy.pp", pp, f"1 with strategy.{key}={options[key]} (a pipeline of "
                               f"{'tensor-parallel' if key == 'tp' else 'HSDP'} stages: not wired), or "
                               f"strategy.{key}=1 with pp")
    for rule in PP_AMP_RULES:
        if rule.matches(amp):
            raise Incompatible(f"amp.{rule.key}", getattr(amp, rule.key),
                               rule.allowed.format(level=amp.level, dtype=amp.dtype))
    check_schedule(cfg, amp, options["schedule"], options["microbatches"], pp,
                   placement.global_batch // (world // pp), f"strategy.pp={pp}")


def check_tensor_parallel(cfg: RunConfig, placement: Placement, amp: AmpSpec, options: Mapping[str, Any]) -> None:
    """`strategy.tp` before anything starts: a divisor of the ranks, not combined with HSDP's replicas (a 3-D mesh),
    uncompiled, at an amp level TP runs, on a model with a plan whose heads divide by it."""
    tp, world = options["tp"], placement.world_size
    if tp < 1:
        raise ConfigError("strategy.tp", tp, "an integer >= 1 (1: no tensor parallelism; N: FSDP x TP, N consecutive "
                          "ranks splitting each block)")
    if tp == 1:
        if options["sequence_parallel"]:
            raise Incompatible("strategy.sequence_parallel", True, "false with strategy.tp=1 (sequence parallelism "
                               "splits what tensor parallelism leaves whole: give strategy.tp=N too)")
        return
    check_divides("strategy.tp", tp, world, "FSDP shards over world/tp groups of tp ranks")
    if options["replicate"] != 1:
        raise Incompatible("strategy.tp", tp, f"1 with strategy.replicate={options['replicate']} (HSDP x TP would "
                           "need a 3-D mesh: not wired), or strategy.replicate=1 with tp")
    if cfg.compile:
        raise ConfigError("compile", True, f"false with strategy.tp={tp} (compiling tensor-parallel blocks is not "
                          "measured yet)")
    for rule in FSDP_TP_AMP_RULES:
        if rule.matches(amp):
            raise Incompatible(f"amp.{rule.key}", getattr(amp, rule.key),
                               rule.allowed.format(level=amp.level, dtype=amp.dtype))
    check_tp_model(cfg, tp, bool(options["sequence_parallel"]), f"strategy.tp={tp}")
