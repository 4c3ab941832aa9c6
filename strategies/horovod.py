"""Horovod (0.28.1, its last release): gradients averaged by `hvd.DistributedOptimizer`'s allreduce.

`horovodrun` normally starts the workers and gives each its place through HOROVOD_* variables served by
its rendezvous server. Here the harness's launcher starts one worker per device, as for DDP, so the parent
samples every worker's memory and PID and the common trainer runs unchanged; `join_horovod` does the rest
of horovodrun's job inside the workers: rank 0 serves horovod's own rendezvous handler on loopback, the
port reaches the other ranks through the harness's process group, and each rank sets the variables
horovodrun would before `hvd.init()`. That process group (gloo, or nccl on GPUs) is the harness's control
channel only: the barrier before the clock and the iterations=auto decision. One node only.

Horovod is built from source against the installed torch (docs/backends.md: "Horovod, XLA and MPI").
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Mapping
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from amp import AmpSpec
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.optional import package_missing
from harness.core.traffic import Buffer, Collective, Traffic
from strategies.base import AmpRule, ProcessGroupStrategy, RankEnv

INSTALL_HINT = ("strategy=horovod needs horovod built against this torch: HOROVOD_WITH_PYTORCH=1 "
                "HOROVOD_WITH_GLOO=1 pip install --no-build-isolation horovod==0.28.1 (docs/backends.md: 'Horovod, XLA and MPI')")


def _hvd() -> Any:
    import horovod.torch as hvd  # optional, built from source: imported only by runs that use it

    return hvd


def join_horovod(env: RankEnv) -> None:
    """Give this worker its place in a one-node horovod world and call hvd.init(); needs the harness's
    process group (to pass the rendezvous port from rank 0 to the others)."""
    if int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size)) != env.world_size:
        raise RuntimeError("strategy=horovod runs on one node (horovodrun's multi-node rendezvous is not wired)")
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    slots = get_host_assignments(parse_hosts(f"localhost:{env.world_size}"), env.world_size)
    port = [serve_rendezvous(slots) if env.rank == 0 else 0]
    dist.broadcast_object_list(port, src=0)
    slot = slots[env.rank]
    os.environ.update(
        HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1", HOROVOD_GLOO_RENDEZVOUS_PORT=str(port[0]),
        HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE="lo",
        HOROVOD_HOSTNAME=slot.hostname, HOROVOD_RANK=str(slot.rank), HOROVOD_SIZE=str(slot.size),
        HOROVOD_LOCAL_RANK=str(slot.local_rank), HOROVOD_LOCAL_SIZE=str(slot.local_size),
        HOROVOD_CROSS_RANK=str(slot.cross_rank), HOROVOD_CROSS_SIZE=str(slot.cross_size))


def serve_rendezvous(slots: list[Any]) -> int:
    """horovod's rendezvous handler on 127.0.0.1 (its RendezvousServer.start binds every interface), in
    a daemon thread of rank 0 for the run's life; its port."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = RendezvousHTTPServer(("127.0.0.1", 0), RendezvousHandler, 0)
    server.init(slots)
    threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True).start()
    return int(server.server_address[1])


def settle_compile_pass(optimizer: torch.optim.Optimizer) -> None:
    """After compile=true's extra backward (no step follows): finish the allreduces its gradient hooks started,
    which horovod requires before zero_grad (horovod/torch/optimizer.py, zero_grad: `if self._handles: raise
    AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or
    optimizer.synchronize()...`). synchronize() also rearms the per-parameter backward counts. It leaves
    `_synchronized` set, so the first timed step() warns ("optimizer.step() called without
    optimizer.skip_synchronize() context after optimizer.synchronize()") and synchronizes as usual: the
    gradients it reduces are that step's own, so the warning is silenced (it would print inside a window)."""
    if not getattr(optimizer, "_handles", None):  # what zero_grad checks: nothing pending (O2's fp32 masters,
        return  # which backward never reaches; synchronize() would read their missing gradients)
    optimizer.synchronize()  # type: ignore[attr-defined]
    warnings.filterwarnings("ignore", message=r"optimizer\.step\(\) called without optimizer\.skip_synchronize")


class HorovodStrategy(ProcessGroupStrategy):
    amp_rules = (
        AmpRule({"impl": "apex"}, "impl", "native with strategy=horovod (apex amp and horovod's DistributedOptimizer "
                "both replace the optimizer's step)"),
        # GradScaler checks each rank's gradients for inf/NaN before horovod's allreduce (in step): ranks could
        # disagree on skipping a step and drift apart.
        AmpRule({"loss_scale": "dynamic"}, "loss_scale", "a fixed scale (e.g. amp.loss_scale=1024) or "
                "amp.dtype=bfloat16 with strategy=horovod at {level}: dynamic scaling would decide on each rank's "
                "gradients before horovod averages them"),
    )
    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """Gradients all-reduced as backward produces them, fused into a 64 MiB buffer (HOROVOD_FUSION_THRESHOLD's
        default); fp16 compression sends them in half."""
        half = "float16" if cls.options_of(options).get("compression") == "fp16" else None
        return Traffic((Collective("all_reduce", "grads", "backward", half),),
                       (Buffer("bucket", dtype=half, bucket_cap_mb=64),))

    def __init__(self, compression: Literal["none", "fp16"] = "none") -> None:
        super().__init__()
        self.compression = compression
        self._grad_accum = 1

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return package_missing("horovod", INSTALL_HINT)

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        """No backend option: the control group follows the device."""

    @classmethod
    def lossy(cls, options: Mapping[str, Any]) -> str | None:
        # horovod/torch/compression.py, FP16Compressor.compress: `tensor_compressed = tensor.type(torch.float16)`
        if cls.options_of(options)["compression"] == "fp16":
            return "compression=fp16: every gradient is rounded to fp16 for the allreduce"
        return None

    def setup(self, env: RankEnv) -> None:
        super().setup(env)
        self._grad_accum = env.grad_accum
        join_horovod(env)
        hvd = _hvd()
        hvd.init()
        if (hvd.rank(), hvd.size()) != (env.rank, env.world_size):
            raise RuntimeError(f"horovod put rank {env.rank} of {env.world_size} at {hvd.rank()} of {hvd.size()}")

    def wrap(self, model: nn.Module) -> nn.Module:
        """No model wrapper: horovod all-reduces through its optimizer (wrap_optimizer)."""
        return model

    def wrap_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Rank 0's weights and optimizer state to every rank, then horovod's optimizer: an allreduce hook per
        gradient, averaged before `step`. With grad_accum N, `backward_passes_per_step=N`: each hook starts
        its allreduce at the Nth backward, on the accumulated gradient (horovod's own no_sync; with 1, the
        second micro-batch's backward raises "Gradients were computed more than backward_passes_per_step
        times before call to step()")."""
        hvd = _hvd()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        own = {id(p) for group in optimizer.param_groups for p in group["params"]}
        named = [(n, p) for n, p in model.named_parameters() if id(p) in own]
        compression = hvd.Compression.fp16 if self.compression == "fp16" else hvd.Compression.none
        # O2's fp32 masters are not the model's parameters: horovod then reduces them in step()
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=named or None, compression=compression,
                                             backward_passes_per_step=self._grad_accum)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return optimizer

    def after_compile_pass(self, optimizer: torch.optim.Optimizer) -> None:
        settle_compile_pass(optimizer)

    def teardown(self) -> None:
        if self.is_set_up:
            try:
                _hvd().shutdown()
            except ImportError:
                pass
        super().teardown()
