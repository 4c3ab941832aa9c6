"""torch.nn.parallel.DistributedDataParallel, one process per device, with torch's communication hooks."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from amp import AmpSpec
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.errors import ConfigError, Incompatible
from harness.core.traffic import Buffer, Collective, Traffic
from strategies.base import Backend, ProcessGroupStrategy
from strategies.capabilities import GradientSyncControl

CommHook = Literal["none", "fp16", "bf16", "powersgd"]
HOOK_DTYPE = {"fp16": "float16", "bf16": "bfloat16"}  # what a compression hook sends (harness.prediction)


class TorchDDP(GradientSyncControl, ProcessGroupStrategy):
    """`comm_hook`: how DDP's buckets are communicated. `fp16`/`bf16` cast each bucket to half before the
    all-reduce and back after (half the bytes on the wire); `powersgd` sends a rank-`powersgd_rank`
    approximation of each gradient matrix with error feedback, after `powersgd_start_iter` iterations of
    plain all-reduce (PowerSGD's own warm-up; torch's default is 1,000, longer than a benchmark run)."""

    searchable = True

    def __init__(self, find_unused_parameters: bool = False, bucket_cap_mb: float = 25,
                 gradient_as_bucket_view: bool = False, comm_hook: CommHook = "none", powersgd_rank: int = 1,
                 powersgd_start_iter: int = 2, backend: Backend = "auto") -> None:
        super().__init__()
        self.backend = backend
        self.options = dict(find_unused_parameters=find_unused_parameters, bucket_cap_mb=bucket_cap_mb,
                            gradient_as_bucket_view=gradient_as_bucket_view)
        self.comm_hook, self.powersgd_rank, self.powersgd_start_iter = comm_hook, powersgd_rank, powersgd_start_iter
        self.powersgd_state: powerSGD_hook.PowerSGDState | None = None

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        super().check_run(cfg, placement, amp)
        options = cls.options_of(cfg.strategy)
        if options["powersgd_rank"] < 1:
            raise ConfigError("strategy.powersgd_rank", options["powersgd_rank"], "an integer >= 1")
        if options["powersgd_start_iter"] < 2:
            # torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py refuses less with error feedback:
            # "Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or `warm_start` is enabled"
            raise ConfigError("strategy.powersgd_start_iter", options["powersgd_start_iter"], "an integer >= 2")
        if options["comm_hook"] == "powersgd" and amp.loss_scale == "dynamic":
            # torch's hook adds its stored error to the gradient and keeps the new error (and Q) computed from it
            # (powerSGD_hook.py: `input_tensor.add_(state.error_dict[bucket_index])`, then
            # `state.error_dict[bucket_index] = input_tensor_cp - input_tensor`): one overflowed step, which the
            # scaler only skips, leaves inf/NaN in that state, and every later gradient is non-finite too.
            raise Incompatible("strategy.comm_hook", "powersgd", f"none, fp16 or bf16 with dynamic loss scaling "
                               f"({amp.level} {amp.dtype}; bfloat16 needs none): PowerSGD's error feedback keeps "
                               "an overflowed step's inf/NaN, so every later step overflows and is skipped")

    @classmethod
    def variant(cls, options: Mapping[str, Any]) -> str:
        options = cls.options_of(options)
        hook = options["comm_hook"]
        if hook == "powersgd":
            return f"comm_hook=powersgd(rank {options['powersgd_rank']})"
        return "" if hook == "none" else f"comm_hook={hook}"

    @classmethod
    def lossy(cls, options: Mapping[str, Any]) -> str | None:
        options = cls.options_of(options)
        hook = options["comm_hook"]
        if hook in ("fp16", "bf16"):
            return f"comm_hook={hook}: every gradient is rounded to {hook} for the all-reduce"
        if hook == "powersgd":
            return (f"comm_hook=powersgd: gradients are sent as a rank-{options['powersgd_rank']} "
                    "approximation after the first iterations")
        return None

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """Buckets all-reduced as backward fills them (overlapped); the buckets are a second copy of the
        gradients unless gradient_as_bucket_view; a compression hook adds a half copy of one bucket. Without a
        hook the all-reduce works on the bucket itself: no bucket more. (One was counted while the CPU probe
        kept blocks that gloo's threads free unseen: a bucket's all-reduce result, held in 4 of 20 rank-trials
        of DDP(TinyCNN) on 2 ranks. Since the probe counts such a block freed once its address is handed out
        again, resnet18's DDP and ZeRO runs measure 25 MiB, one bucket, below a prediction that kept it:
        benchmark 13, 2026-12-06.)"""
        o = cls.options_of(options)
        hook = o["comm_hook"]
        sent = Collective("all_reduce", "powersgd", "backward", powersgd_rank=o["powersgd_rank"]) \
            if hook == "powersgd" else Collective("all_reduce", "grads", "backward", HOOK_DTYPE.get(hook))
        buffers = () if o["gradient_as_bucket_view"] else (Buffer("grads"),)
        if hook in HOOK_DTYPE:
            buffers += (Buffer("bucket", dtype=HOOK_DTYPE[hook], bucket_cap_mb=o["bucket_cap_mb"]),)
        return Traffic((sent,), buffers)

    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, **self.options)
        self.register_hook(ddp)
        return ddp

    def register_hook(self, ddp: DistributedDataParallel) -> None:
        if self.comm_hook == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.comm_hook == "bf16":
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif self.comm_hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=self.powersgd_rank,
                                                start_powerSGD_iter=self.powersgd_start_iter)
            self.powersgd_state = state
            on_gloo = dist.get_backend() == "gloo"
            ddp.register_comm_hook(state, one_bucket_at_a_time if on_gloo else powerSGD_hook.powerSGD_hook)

    def after_compile_pass(self, optimizer: torch.optim.Optimizer) -> None:
        """The compile pass's backward ran the comm hook once, and PowerSGD counted it as a training iteration
        (powerSGD_hook.py, PowerSGDState.maybe_increase_iter: `if bucket.is_last(): self.iter += 1`): back to 0,
        so the timed run still gets `powersgd_start_iter` plain all-reduce iterations. Nothing else changed:
        with start_iter >= 2 (check_run) that one hook call was a plain all-reduce, no error feedback kept."""
        if self.powersgd_state is not None:
            self.powersgd_state.iter = 0

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return model.no_sync()  # torch.compile's OptimizedModule passes attributes through to the DDP module


def one_bucket_at_a_time(state: powerSGD_hook.PowerSGDState,
                         bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PowerSGD on gloo, each bucket's all-reduces finished before the next bucket's begin.

    torch's hook chains a bucket's all-reduces (P, then Q) in future callbacks, which gloo runs on its own
    worker threads: with two buckets in flight the ranks issue their collectives in different orders, and
    gloo matches them by order ("Received data size doesn't match expected size", an abort; resnet18 on two
    CPU workers, not a one-bucket model). torch tests the hook on NCCL only (pytorch#58467). Waiting here
    keeps PowerSGD's arithmetic and bytes and gives up only its overlap with backward, on gloo only."""
    future = powerSGD_hook.powerSGD_hook(state, bucket)
    future.wait()
    return future


# DistributedDataParallel._check_comm_hook compares a hook's annotations with the objects
# (`sig.parameters["bucket"].annotation != dist.GradBucket`); this module's are strings (postponed evaluation)
one_bucket_at_a_time.__annotations__.update(bucket=dist.GradBucket, state=powerSGD_hook.PowerSGDState)
one_bucket_at_a_time.__annotations__["return"] = torch.futures.Future[torch.Tensor]
