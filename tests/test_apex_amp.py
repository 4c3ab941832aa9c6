"""amp.apex against a fake apex that reproduces apex 25.05's patched optimizer (see fake_apex.py)."""

from __future__ import annotations

import torch
from conftest import amp_plugin, sgd, tiny_batch
from fake_apex import fake_apex  # noqa: F401 (fixture)

from amp.levels import AmpConfig, resolve
from harness.rank.data import SyntheticSource
from harness.rank.models import TinyCNN
from harness.rank.timing import WindowClock
from harness.rank.trainer import train


def test_apex_o2_trains_past_its_first_iteration(fake_apex):  # noqa: F811
    """Before: the trainer called zero_grad(set_to_none=True) and apex's argument-less zero_grad raised
    TypeError at iteration 1."""
    spec = resolve(AmpConfig(level="O2", impl="apex", dtype="float16"), "cuda")
    precision = amp_plugin(spec)
    torch.manual_seed(0)
    model, optimizer = precision.prepare(TinyCNN(num_classes=10), sgd())
    before = [p.detach().clone() for p in model.parameters()]
    clock = WindowClock(lambda: None, warmup_windows=0)
    train(precision.wrap_module(model), optimizer, precision, SyntheticSource([tiny_batch()]), clock, iterations=4, log_every=2)
    assert [w.end_iter for w in clock.windows] == [2, 4]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())  # apex's own zero_grad ran
    assert precision.state()["final_loss_scale"] == 1.0
