"""What the worker and the launcher ask of a strategy. Class attributes say how processes are laid out,
so the parent can place and validate a run without building anything; `setup_module` owns the order in
which the model is converted, moved, cast, sharded, given its optimizer and wrapped."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, Literal

import torch
import torch.distributed as dist
from torch import nn

from amp import Amp, AmpSpec, OptimizerSpec
from harness.core.config import RunConfig
from harness.core.devices import DeviceOps, Placement
from harness.core.errors import Incompatible
from harness.core.traffic import Traffic


@dataclass(frozen=True)
class RankEnv:
    rank: int
    local_rank: int
    world_size: int
    placement: Placement
    timeout_s: float
    grad_accum: int = 1  # micro-batches per optimizer step (cfg.grad_accum): horovod's optimizer counts them


@dataclass(frozen=True)
class AmpRule:
    """One row of a strategy's compatibility with the amp levels as resolved (`AmpSpec`): where every
    attribute named in `when` has its value (or one of a tuple's), the run is refused before anything starts,
    naming `amp.<key>` and its value, and saying what is allowed (`{level}` and `{dtype}` filled in). The
    table of every strategy's rules is docs/strategies.md's (`python -m strategies.compat`)."""

    when: Mapping[str, Any]
    key: str
    allowed: str

    def matches(self, amp: AmpSpec) -> bool:
        return all(getattr(amp, name) in (value if isinstance(value, tuple) else (value,))
                   for name, value in self.when.items())


class Strategy:
    one_process_per_device: ClassVar[bool] = False  # True: the launcher starts a worker per device
    drives_all_devices: ClassVar[bool] = False  # True: one process uses every chosen GPU
    needs_cuda: ClassVar[bool] = False
    # Which of parameters, gradients and optimizer state each rank holds only 1/world_size of (theory).
    shards: ClassVar[tuple[bool, bool, bool]] = (False, False, False)
    amp_rules: ClassVar[tuple[AmpRule, ...]] = ()  # amp levels, implementations and dtypes it refuses

    def __init__(self) -> None:
        self._ops: DeviceOps | None = None

    # ---- decided in the parent, before anything starts ----

    def unit_names(self, model: nn.Module) -> list[str]:
        """The modules whose parameters are gathered one at a time (FSDP's units); none here."""
        return []

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """What each iteration sends and what is held to send it (harness.plan's predictions): nothing."""
        return Traffic()

    @classmethod
    def skip_reason(cls, placement: Placement, amp: AmpSpec) -> str | None:
        """Why this strategy has nothing to measure on this placement (recorded as `skipped`)."""
        if cls.needs_cuda and placement.accelerator != "cuda":
            return "needs CUDA GPUs; this machine has none (ran nothing)"
        return None

    @classmethod
    def check_compatible(cls, placement: Placement, amp: AmpSpec) -> None:
        """Raise Incompatible for an amp level this strategy would run wrongly: its first rule that matches."""
        for rule in cls.amp_rules:
            if rule.matches(amp):
                raise Incompatible(f"amp.{rule.key}", getattr(amp, rule.key),
                                   rule.allowed.format(level=amp.level, dtype=amp.dtype))

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        """The strategy's options (`cfg.strategy`, types already checked) against the rest of the run (compile,
        grad_accum, the global batch), before anything starts: ConfigError for a value its type allows but no
        run can use, Incompatible for one this machine, this torch or the run's other settings cannot honour
        (e.g. a communication backend it lacks)."""

    @classmethod
    def options_of(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options as a run of this strategy has them: those given, the constructor's defaults for the rest
        (a default lives once, in the signature; the parent's checks read it from there)."""
        params = inspect.signature(cls.__init__).parameters.values()
        defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        return {**defaults, **{k: v for k, v in options.items() if k != "_target_"}}

    @classmethod
    def variant(cls, options: Mapping[str, Any]) -> str:
        """The options that make this run a different combination from the strategy's plain one, for the
        report's label (e.g. `comm_hook=bf16`); empty when there are none."""
        return ""

    @classmethod
    def lossy(cls, options: Mapping[str, Any]) -> str | None:
        """Why these options make the update deliberately inexact (gradients sent in half precision, a low-rank
        approximation...), for numerical parity, which then reports the row's drift instead of judging it
        against float32 rounding; None when the options compute the exact update."""
        return None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """A missing optional package: an error for a single run, a `skipped` row in a sweep."""
        return None

    # ---- in every rank ----

    def setup(self, env: RankEnv) -> None:
        placement = env.placement
        if self.one_process_per_device:
            indices = placement.torch_indices[env.local_rank:env.local_rank + 1]
            labels: tuple[str, ...] = (placement.rank_device(env.local_rank),)
        else:
            indices, labels = placement.torch_indices, placement.devices
        self._ops = DeviceOps(placement.accelerator, indices, labels)

    @property
    def ops(self) -> DeviceOps:
        if self._ops is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not run")
        return self._ops

    @property
    def is_set_up(self) -> bool:
        return self._ops is not None

    @property
    def device(self) -> torch.device:
        return self.ops.device

    def setup_module(self, model: nn.Module, amp: Amp,
                     optimizer: OptimizerSpec) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model as it will train, and its optimizer, in phases whose order no strategy changes (a strategy
        overrides the phases it does differently): layer swaps, onto the device, the amp plugin's casting,
        parameters replaced by shards (FSDP2), the optimizer (built here only, over the parameters the amp
        plugin steps, then joined to the plugin: apex's amp.initialize must precede any parallel wrapper),
        the wrapper (DDP, DataParallel, ...) and whatever the strategy wraps the optimizer in. `compile` comes
        last, called by the worker, which times it apart."""
        model = self.place(self.convert_module(model))
        model = self.apply_precision(model, amp)
        model = self.shard(model, amp)
        model, built = amp.connect(model, self.build_optimizer(amp.optimizer_params(model), optimizer))
        model = self.wrap(amp.wrap_module(model))
        return model, self.wrap_optimizer(model, built)

    def convert_module(self, model: nn.Module) -> nn.Module:
        """Layer swaps needed before the amp plugin casts the model (e.g. synchronized batch-norm)."""
        return model

    def place(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def apply_precision(self, model: nn.Module, amp: Amp) -> nn.Module:
        """The amp plugin casts the model (and makes the fp32 masters it steps, at O2)."""
        return amp.cast_module(model)

    def shard(self, model: nn.Module, amp: Amp) -> nn.Module:
        """Parameters replaced by the strategy's own (FSDP2's DTensor shards): before the optimizer is built,
        so that it steps those."""
        return model

    def build_optimizer(self, params: Iterable[nn.Parameter], optimizer: OptimizerSpec) -> torch.optim.Optimizer:
        """The one place an optimizer is built: the configured class over `params` (ZeRO shards it)."""
        return optimizer.build(params)

    def wrap(self, model: nn.Module) -> nn.Module:
        """The parallel wrapper, around parameters that stay as they are (DDP, DataParallel, ...)."""
        return model

    def wrap_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer as the strategy steps it (horovod's DistributedOptimizer, ignite's auto_optim)."""
        return optimizer

    def compile(self, model: nn.Module) -> nn.Module:
        """compile=true: the wrapped model compiled (DDP's graph is split at its buckets by dynamo's
        DDPOptimizer; FSDP2's hooks are traced). Compilation itself happens at the first call."""
        return torch.compile(model)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """grad_accum: entered around every micro-batch but the last of a step, so that gradients only
        accumulate locally and are communicated once per optimizer step. One process: nothing to skip."""
        return contextlib.nullcontext()

    def after_compile_pass(self, optimizer: torch.optim.Optimizer) -> None:
        """compile=true: called after the compile pass's backward, before its gradients are dropped, to undo
        what that extra backward did to the strategy's own state, so the timed run starts as an uncompiled
        one would (e.g. a communication hook's iteration count, gradients a wrapped optimizer still awaits)."""

    def synchronize(self) -> None:
        self.ops.synchronize()

    def compile_seconds(self) -> float | None:
        """Seconds this rank spent compiling (XLA graphs), read after the timed loop; None: nothing compiled."""
        return None

    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The trained parameters as one device would hold them, by the unwrapped model's names, on the CPU
        in float32: what numerical parity compares across strategies and between replicas. A strategy that
        shards parameters overrides this to gather them first (every rank must call it)."""
        return {name: p.detach().float().cpu().clone() for name, p in unwrap(model).named_parameters()}

    def barrier(self) -> None:
        """Line ranks up before the clock starts."""

    def max_over_ranks(self, value: float) -> float:
        """The largest `value` any rank holds (iterations=auto decides on the slowest rank's clock)."""
        return value

    def teardown(self) -> None:
        pass


Backend = Literal["auto", "gloo", "nccl", "mpi"]


def check_backend(backend: str, accelerator: str) -> None:
    """The torch.distributed backend a run asks for (`strategy.backend`), refused here when it cannot work:
    nccl needs GPUs; mpi needs a torch built from source with MPI (the published wheels are not:
    `torch.distributed.is_mpi_available()` is False) and processes started by `mpirun`, which assigns the
    ranks (init_process_group("mpi") ignores the launcher's RANK/WORLD_SIZE)."""
    if backend == "nccl" and accelerator != "cuda":
        raise Incompatible("strategy.backend", backend, "auto or gloo on the CPU: nccl runs only on CUDA GPUs")
    if backend == "mpi":
        if not dist.is_mpi_available():
            raise Incompatible("strategy.backend", backend, f"auto, gloo or nccl: this torch ({torch.__version__}) "
                               "was built without MPI (torch.distributed.is_mpi_available() is False, as for every "
                               "published wheel; MPI needs torch built from source against an MPI library)")
        raise Incompatible("strategy.backend", backend, "auto, gloo or nccl: this torch has MPI, but MPI ranks are "
                           "assigned by mpirun and the harness starts its workers itself (not wired yet)")
def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside its wrappers: torch.compile's OptimizedModule keeps it as `_orig_mod`;
    DDP, DataParallel and the amp plugin's CastingModule as `module`."""
    inner = getattr(model, "_orig_mod", model)
    while isinstance(getattr(inner, "module", None), nn.Module):
        inner = inner.module
    return inner


class ProcessGroupStrategy(Strategy):
    """One process per device joined in a torch.distributed process group (nccl on GPUs, gloo on CPU, or
    the subclass's `backend` option)."""

    one_process_per_device = True
    backend: str = "auto"

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        check_backend(str(cls.options_of(cfg.strategy).get("backend", cls.backend)), placement.accelerator)  # fsdp: none

    @property
    def backend_name(self) -> str:
        return self.ops.dist_backend if self.backend == "auto" else self.backend

    def setup(self, env: RankEnv) -> None:
        super().setup(env)
        device_id = self.ops.device if self.ops.accelerator == "cuda" else None
        dist.init_process_group(self.backend_name, rank=env.rank, world_size=env.world_size,
                                timeout=timedelta(seconds=env.timeout_s), device_id=device_id)

    def barrier(self) -> None:
        if self.ops.accelerator == "cuda":
            dist.barrier(device_ids=[self.ops.device.index])
        else:
            dist.barrier()

    def max_over_ranks(self, value: float) -> float:
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
