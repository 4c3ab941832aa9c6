"""amp.apex against a fake apex that reproduces apex 25.05's patched optimizer (see fake_apex.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from conftest import amp_plugin, prepare, sgd, tiny_batch
from fake_apex import fake_apex  # noqa: F401 (fixture)
from torch.distributed.optim import ZeroRedundancyOptimizer

from harness.core.amp_levels import AmpConfig, resolve
from harness.core.devices import Placement
from harness.core.errors import Incompatible
from harness.core.timing import WindowClock
from harness.rank.data import SyntheticSource
from harness.rank.models import TinyCNN
from harness.rank.trainer import train
from strategies.ddp import TorchDDP
from strategies.zero import ZeroDDP


def test_apex_o2_trains_past_its_first_iteration(fake_apex):  # noqa: F811
    """Before: the trainer called zero_grad(set_to_none=True) and apex's argument-less zero_grad raised
    TypeError at iteration 1."""
    spec = resolve(AmpConfig(level="O2", impl="apex", dtype="float16"), "cuda")
    precision = amp_plugin(spec)
    torch.manual_seed(0)
    model, optimizer = prepare(precision, TinyCNN(num_classes=10), sgd())
    before = [p.detach().clone() for p in model.parameters()]
    clock = WindowClock(lambda: None, warmup_windows=0)
    train(precision.wrap_module(model), optimizer, precision, SyntheticSource([tiny_batch()]), clock, iterations=4, log_every=2)
    assert [w.end_iter for w in clock.windows] == [2, 4]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())  # apex's own zero_grad ran
    assert precision.state()["final_loss_scale"] == 1.0


def test_zero_refuses_apex_where_apex_keeps_master_weights():
    """apex swaps fp32 masters into the optimizer's param_groups, which ZeroRedundancyOptimizer never steps
    (it steps the inner optimizer it built from the half parameters); apex then copies the unchanged masters
    back over the model, so the weights would never train. Without masters both step the same tensors."""
    gpus = Placement("cuda", (0, 1), (0, 1), 2, True, ("cuda:0", "cuda:1"), 1, 8)
    o2 = resolve(AmpConfig(level="O2", impl="apex", dtype="float16"), "cuda")
    with pytest.raises(Incompatible, match=r"amp.impl=apex is not allowed: native with strategy=zero at O2"):
        ZeroDDP.check_compatible(gpus, o2)
    with pytest.raises(Incompatible, match="never|copies back"):
        ZeroDDP.check_compatible(gpus, resolve(AmpConfig("O3", impl="apex", master_weights=True), "cuda"))
    for allowed in (AmpConfig("O1", impl="apex"), AmpConfig("O2", impl="apex", master_weights=False),
                    AmpConfig("O3", impl="apex"), AmpConfig("O2")):
        ZeroDDP.check_compatible(gpus, resolve(allowed, "cuda"))
    TorchDDP.check_compatible(gpus, o2)  # DDP steps apex's optimizer itself, masters included


def test_zero_never_steps_parameters_swapped_into_its_param_groups():
    """Why the refusal above: apex O2 swaps each half parameter in the optimizer's param_groups for an fp32
    master (apex/amp/_process_optimizer.py, lazy_init_with_master_weights: `param_group['params'][i] =
    master_param`); ZeroRedundancyOptimizer's step runs its inner optimizer, built from the parameters it was
    given, so the master keeps its value (then apex copies it back over the model: no training at all)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        half = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
        zero = ZeroRedundancyOptimizer([half], optimizer_class=torch.optim.SGD, lr=0.5)
        master = torch.nn.Parameter(half.detach().float())
        zero.param_groups[0]["params"][0] = master  # what apex does to the optimizer it is given
        master.grad = torch.ones(4)
        half.grad = torch.ones(4, dtype=torch.float16)
        zero.step()
        assert torch.equal(master, torch.ones(4))  # a plain SGD over param_groups would give 1 - 0.5 = 0.5
        assert torch.equal(half, torch.full((4,), 0.5, dtype=torch.float16))  # the half weight was stepped
    finally:
        dist.destroy_process_group()
