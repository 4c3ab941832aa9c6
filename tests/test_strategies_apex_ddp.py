"""strategy=apex_ddp against a fake apex (tests/fake_apex.py: apex 25.05's amp and its
`apex.parallel.DistributedDataParallel`, each behaviour quoting apex's line): the model the strategy builds, the
options it hands apex, and, in two processes, gradients averaged across the world."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import fake_apex as apex_fake
import pytest
import torch
import torch.distributed as dist
from conftest import amp_plugin, leave_at_once, start_ranks, tiny_batch
from fake_apex import FLOAT, HALF, fake_apex  # noqa: F401 (fixture)
from torch import nn

from amp import OptimizerSpec
from harness.core.amp_levels import AmpConfig, resolve
from harness.core.devices import Placement
from harness.core.timing import WindowClock
from harness.launch.launcher import loopback_interface
from harness.rank.data import SyntheticSource
from harness.rank.models import TinyCNN
from harness.rank.trainer import train
from strategies.apex_ddp import ApexDDP
from strategies.base import RankEnv, unwrap


def _placement(world: int) -> Placement:
    return Placement(accelerator="cpu", gpus=(), torch_indices=(), nprocs=world, one_process_per_device=True,
                     devices=tuple(f"cpu:{r}" for r in range(world)), threads_per_process=1, global_batch=4 * world)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))


def _o2(loss_scale: str | float = "auto") -> object:
    return amp_plugin(resolve(AmpConfig(level="O2", impl="apex", dtype="float16", loss_scale=loss_scale), "cuda"))


@pytest.mark.parametrize("delay", [False, True])
def test_apex_ddp_wraps_the_cast_model_with_its_options(fake_apex, one_rank, delay):  # noqa: F811
    """setup_module: apex's amp casts first (O2: half convolutions and linear, float32 batch norms), then apex's
    DDP wraps that model with the strategy's delay_allreduce and message_size. What apex then reduces shows both:
    delay_allreduce, one flat bucket per type after each backward; without it, the first backward builds the
    buckets (and reduces by type), the next reduces each bucket of message_size=1 element: one per parameter."""
    strategy = ApexDDP(delay_allreduce=delay, message_size=1)
    strategy.setup(RankEnv(0, 0, 1, _placement(1), timeout_s=30))
    try:
        precision = _o2()
        torch.manual_seed(0)
        model, optimizer = strategy.setup_module(TinyCNN(num_classes=10), precision,
                                                 OptimizerSpec(torch.optim.SGD, {"lr": 0.1}))
        assert isinstance(model, fake_apex.parallel.DistributedDataParallel)
        assert (model.delay_allreduce, model.message_size) == (delay, 1)
        inner = unwrap(model)
        assert inner is model.module and inner.features[0].weight.dtype == torch.float16  # amp ran before the wrap
        assert inner.features[1].weight.dtype == torch.float32
        train(model, optimizer, precision, SyntheticSource([tiny_batch()]), WindowClock(lambda: None, 0),
              iterations=2, log_every=1)
        by_type = [(HALF, 4), (FLOAT, 4)]  # 2 convolutions and the linear's 2; 2 batch norms' weight and bias
        if delay:
            assert model.allreduced == by_type * 2
        else:  # then every parameter its own bucket, in the order its gradient arrived
            assert model.allreduced[:2] == by_type
            assert sorted(model.allreduced[2:]) == sorted([(HALF, 1)] * 4 + [(FLOAT, 1)] * 4)
    finally:
        strategy.teardown()


@pytest.mark.parametrize("delay", [False, True])
def test_apex_ddp_cannot_reduce_bfloat16_which_the_strategy_refuses(fake_apex, one_rank, delay):  # noqa: F811
    """Why ApexDDP.amp_rules refuses bfloat16 weights: apex DDP knows half, float and double only
    (parallel/distributed.py:245-247 and :53-60), so a bfloat16 gradient is a KeyError at the first backward,
    or, with delay_allreduce, never reduced at all."""
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = fake_apex.parallel.DistributedDataParallel(nn.Linear(2, 2).to(torch.bfloat16),
                                                           delay_allreduce=delay)
        loss = model(torch.ones(1, 2, dtype=torch.bfloat16)).sum()
        if delay:
            loss.backward()
            assert model.allreduced == []
        else:
            with pytest.raises(KeyError, match="torch.cuda.BFloat16Tensor"):
                loss.backward()
    finally:
        dist.destroy_process_group()


def test_apex_ddp_needs_torch_distributed_and_refuses_what_apex_refuses(fake_apex, one_rank):  # noqa: F811
    ddp = fake_apex.parallel.DistributedDataParallel
    with pytest.raises(ValueError, match="not been initialized"):  # dist.get_backend(), distributed.py:186
        ddp(nn.Linear(2, 2))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="shared_param is no longer supported"):
            ddp(nn.Linear(2, 2), shared_param=True)
        with pytest.raises(ValueError, match="only valid if delay_allreduce=False"):
            ddp(nn.Linear(2, 2), delay_allreduce=True, allreduce_trigger_params=[])
    finally:
        dist.destroy_process_group()


def _two_steps(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=loopback_interface())
    torch.set_num_threads(1)
    apex_fake.install()
    first = ApexDDP(message_size=1)
    first.setup(RankEnv(rank, rank, 2, _placement(2), timeout_s=60))
    weights = {}
    try:
        for delay in (False, True):
            strategy = first if not delay else ApexDDP(delay_allreduce=True, message_size=1)
            strategy._ops = first._ops  # one process group for both
            model = nn.Linear(2, 1, bias=False)
            with torch.no_grad():
                model.weight.fill_(10.0 * (rank + 1))  # rank 0: 10, rank 1: 20 (rank 0's must win)
            precision = _o2(loss_scale=128.0)  # static: 128 * 2 fits in half, the dynamic 2**16 would not
            model, optimizer = strategy.setup_module(model, precision, OptimizerSpec(torch.optim.SGD, {"lr": 1.0}))
            for _ in range(2):  # the second backward without delay_allreduce: by buckets, as they fill
                precision.backward(model(torch.full((1, 2), float(rank + 1))).sum())  # gradient: rank + 1
                precision.step(optimizer)
                precision.zero_grad(optimizer)
            weights[str(delay)] = unwrap(model).weight.detach().float().flatten().tolist()
        dist.barrier()
    finally:
        first.teardown()
    Path(out, f"rank{rank}.json").write_text(json.dumps(weights))
    leave_at_once()


@pytest.mark.slow
def test_two_ranks_start_from_rank_0_weights_and_average_gradients(tmp_path):
    """Two gloo ranks, apex O2 (fp32 masters made at the first backward, after DDP's broadcast) under
    strategy=apex_ddp, with and without delay_allreduce: 10 - 2 * mean(1, 2) = 7 on both ranks; not 10 - 2 * 3
    (summed), not 8 / 16 (not reduced), not 6 (rank 0's weights, not averaged) nor 17 (rank 1's masters)."""
    start_ranks(_two_steps, (_free_port(), str(tmp_path)), 2)
    for rank in range(2):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == {"False": [7.0, 7.0], "True": [7.0, 7.0]}
