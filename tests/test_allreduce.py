"""strategy=allreduce: hand-written data parallelism keeps replicas identical, and runs like any strategy."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import SHARED_GROUP, amp_plugin, leave_at_once, prepare, start_ranks

from amp import Amp
from harness.core.amp_levels import AmpConfig, AmpSpec, resolve
from harness.core.devices import Placement
from harness.core.timing import WindowClock
from harness.launch.launcher import loopback_interface
from harness.rank.data import SyntheticSource
from harness.rank.models import TinyCNN
from harness.rank.trainer import train
from strategies.allreduce import ManualAllReduce
from strategies.base import RankEnv

WORLD = 2
STEPS = 5


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_placement() -> Placement:
    return Placement(accelerator="cpu", gpus=(), torch_indices=(), nprocs=WORLD, one_process_per_device=True,
                     devices=tuple(f"cpu:{r}" for r in range(WORLD)), threads_per_process=1,
                     global_batch=4 * WORLD)


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def _rank_main(rank: int, port: int) -> None:
    """Every scenario in one process group: one spawn, a few seconds."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=loopback_interface())
    torch.set_num_threads(1)
    first = ManualAllReduce()
    first.setup(RankEnv(rank, rank, WORLD, cpu_placement(), timeout_s=30))
    try:
        for bucket in (False, True):
            for level in ("O0", "O2"):  # O2 on CPU: bfloat16 weights and gradients, fp32 master weights
                strategy = first if (bucket, level) == (False, "O0") else ManualAllReduce(bucket)
                strategy._ops = first._ops  # the process group is shared; each scenario hooks its own model
                _check_scenario(strategy, rank, resolve(AmpConfig(level=level), "cpu"))
        dist.barrier()  # both ranks past their last collective before either tears the group down
    finally:
        first.teardown()
    leave_at_once()  # a rank that exited through the interpreter's shutdown once aborted (SIGABRT) in CI


def _build(spec: AmpSpec, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Amp]:
    torch.manual_seed(seed)
    precision = amp_plugin(spec)
    model, optimizer = prepare(precision, TinyCNN(num_classes=10),
                                         lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    return precision.wrap_module(model), optimizer, precision


def _check_scenario(strategy: ManualAllReduce, rank: int, spec: AmpSpec) -> None:
    label = f"bucket={strategy.bucket} amp={spec.level}"
    # O0: different initial weights per rank, so wrap()'s broadcast is what makes them equal. O2's fp32
    # master weights are copied in prepare(amp, ), before any strategy wraps (DDP's broadcast would
    # not reach them either): there the shared seed, as in the worker, keeps them equal.
    model, optimizer, precision = _build(spec, seed=100 + rank if not spec.master_weights else 100)
    model = strategy.wrap(model)
    generator = torch.Generator().manual_seed(rank)  # different data per rank
    images, labels = torch.randn(4, 3, 8, 8, generator=generator), torch.randint(0, 10, (4,), generator=generator)

    # One backward: every gradient is the mean of the ranks' local gradients (computed here without hooks).
    reference, _, _ = _build(spec, seed=0)
    reference.load_state_dict(model.state_dict())
    with precision.forward_context():
        F.cross_entropy(reference(images), labels).backward()
    expected = [p.grad.clone() for p in reference.parameters()]
    for grad in expected:
        dist.all_reduce(grad)
        grad.div_(WORLD)
    with precision.forward_context():
        F.cross_entropy(model(images), labels).backward()
    for got, want in zip((p.grad for p in model.parameters()), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=lambda m: f"{label}: {m}")
    for p in model.parameters():
        p.grad = None

    # A few steps through the common trainer loop: replicas stay bit-identical.
    train(model, optimizer, precision, SyntheticSource([(images, labels)]), WindowClock(lambda: None, 0), STEPS, STEPS)
    mine = flat_params(model)
    gathered = [torch.empty_like(mine) for _ in range(WORLD)]
    dist.all_gather(gathered, mine)
    assert all(torch.equal(gathered[0], other) for other in gathered[1:]), f"{label}: replicas differ"
    assert not torch.equal(mine, flat_params(reference)), f"{label}: training did not move the weights"


@pytest.mark.slow
def test_replicas_identical_and_gradients_averaged():
    """2 gloo ranks, different data and initial weights; bucket false/true, amp O0/O2."""
    start_ranks(_rank_main, (free_port(),), WORLD)


@pytest.mark.slow
@pytest.mark.xdist_group(SHARED_GROUP)  # one worker runs the shared sweep
def test_sweep_report_has_ddp_and_allreduce(shared_sweep):
    sweep_dir, _ = shared_sweep  # conftest: strategy=single,ddp,allreduce on two gloo workers
    report = (sweep_dir / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and "combination" not in line]
    assert any(r.startswith("| ddp O0") for r in rows), report
    assert any(r.startswith("| allreduce O0") for r in rows), report
    runs = [json.loads(p.read_text()) for p in Path(sweep_dir).glob("*/results.json")]
    assert {r["strategy"]: r["status"] for r in runs} == {"single": "ok", "ddp": "ok", "allreduce": "ok"}, runs
    allreduce = next(r for r in runs if r["strategy"] == "allreduce")
    assert allreduce["config"]["strategy"]["bucket"] is False and allreduce["world_size"] == 2


class EightIdenticalRanks:
    """Stands in for torch.distributed in this process: a world of 8 ranks that all hold this rank's
    values, so all_reduce(SUM) multiplies by 8 in place, in the tensor's own dtype (as NCCL sums float16)."""

    ReduceOp = dist.ReduceOp
    WORLD = 8

    def get_world_size(self) -> int:
        return self.WORLD

    def all_reduce(self, tensor: torch.Tensor, op: object = None) -> None:
        assert op == dist.ReduceOp.SUM
        tensor.mul_(self.WORLD)


@pytest.mark.parametrize("bucketed", [False, True])
def test_float16_loss_scaled_gradients_are_divided_before_the_sum(monkeypatch, bucketed):
    """A float16 gradient of 2^13 (loss-scaled) on 8 ranks: summing first gives 2^16 = inf in float16; the
    mean, what DDP computes, is 2^13. Dividing first, as torch's DDP hook does, keeps it finite."""
    import strategies.allreduce as module

    monkeypatch.setattr(module, "dist", EightIdenticalRanks())
    grads = [torch.full((3,), 8192.0, dtype=torch.float16), torch.full((2,), 0.5, dtype=torch.float32)]
    (module.all_reduce_mean_bucketed if bucketed else module.all_reduce_mean)(grads)
    assert torch.equal(grads[0], torch.full((3,), 8192.0, dtype=torch.float16))
    assert torch.equal(grads[1], torch.full((2,), 0.5))


class TwoRanksOtherHoldsZeros:
    """torch.distributed for a world of 2 whose other rank's gradients are all zero: SUM adds nothing, so
    the mean is this rank's gradient divided by 2, in whatever buffer the all-reduce was given."""

    ReduceOp = dist.ReduceOp

    def get_world_size(self) -> int:
        return 2

    def all_reduce(self, tensor: torch.Tensor, op: object = None) -> None:
        assert op == dist.ReduceOp.SUM


@pytest.mark.parametrize("bucketed", [False, True])
def test_every_gradient_ends_up_the_mean(monkeypatch, bucketed):
    import strategies.allreduce as module

    monkeypatch.setattr(module, "dist", TwoRanksOtherHoldsZeros())
    grads = [torch.tensor([4.0, 6.0]), torch.tensor([2.0], dtype=torch.bfloat16), torch.tensor([[8.0]])]
    (module.all_reduce_mean_bucketed if bucketed else module.all_reduce_mean)(grads)
    assert [g.tolist() for g in grads] == [[2.0, 3.0], [1.0], [[4.0]]]
    assert grads[1].dtype == torch.bfloat16
