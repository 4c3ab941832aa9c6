"""strategy=horovod: refused or skipped with the build recipe where horovod is missing (CI), and where it is
installed (docs/backends.md: "Horovod, XLA and MPI"), two workers started like DDP's average their gradients."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import socket
import types
from collections import Counter
from pathlib import Path
from typing import Any

import fake_horovod
import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from amp import Amp, OptimizerSpec, build_amp
from harness.core.amp_levels import AmpConfig, resolve
from harness.core.devices import Placement
from harness.core.errors import Incompatible
from harness.core.timing import WindowClock
from harness.rank.trainer import compile_pass, train
from strategies.base import RankEnv, Strategy
from strategies.capabilities import no_sync_for
from strategies.horovod import INSTALL_HINT, HorovodStrategy

HAVE_HOROVOD = importlib.util.find_spec("horovod") is not None
CPU2 = Placement(accelerator="cpu", gpus=(), torch_indices=(), nprocs=2, one_process_per_device=True,
                 devices=("cpu:0", "cpu:1"), threads_per_process=1, global_batch=2)


@pytest.mark.skipif(HAVE_HOROVOD, reason="horovod is installed here")
def test_missing_horovod_is_a_reason_with_the_build_recipe():
    assert HorovodStrategy.unavailable_reason() == INSTALL_HINT
    assert "HOROVOD_WITH_PYTORCH=1" in INSTALL_HINT and "horovod==0.28.1" in INSTALL_HINT


@pytest.mark.parametrize(("overrides", "key"), [
    (dict(level="O1", impl="apex"), "amp.impl"),
    (dict(level="O1", dtype="float16"), "amp.loss_scale"),  # fp16 at O1: dynamic scaling
])
def test_combinations_horovod_would_run_wrongly_are_refused(overrides, key):
    with pytest.raises(Incompatible, match=key):
        HorovodStrategy.check_compatible(CPU2, resolve(AmpConfig(**overrides), "cuda"))


def test_fixed_loss_scale_and_bfloat16_are_accepted():
    HorovodStrategy.check_compatible(CPU2, resolve(AmpConfig(level="O1", dtype="float16", loss_scale=1024.0), "cuda"))
    HorovodStrategy.check_compatible(CPU2, resolve(AmpConfig(level="O1", dtype="bfloat16"), "cpu"))


def _one_step(rank: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    strategy = HorovodStrategy()
    strategy.setup(RankEnv(rank, rank, 2, CPU2, 60))
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(10.0 * (rank + 1))  # rank 0: 10, rank 1: 20 (rank 0's must win)
    amp = Amp(resolve(AmpConfig(level="O0"), "cpu"), torch.device("cpu"))
    model, optimizer = strategy.setup_module(model, amp, OptimizerSpec(torch.optim.SGD, {"lr": 1.0}))
    model(torch.full((1, 2), float(rank + 1))).sum().backward()  # gradient: rank + 1 per weight
    amp.step(optimizer)
    amp.zero_grad(optimizer)
    Path(out, f"rank{rank}.json").write_text(json.dumps(model.weight.detach().flatten().tolist()))
    strategy.teardown()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_HOROVOD, reason="horovod is not installed (docs/backends.md: 'Horovod, XLA and MPI')")
def test_two_workers_start_from_rank_0_weights_and_average_gradients(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_one_step, args=(port, str(tmp_path)), nprocs=2, join=True)
    weights = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # 10 - mean(1, 2) = 8.5; not 10 - 3 (summed), not 10 - 1 / 20 - 2 (not reduced), not 20 - 1.5 (no broadcast)
    assert weights == [[8.5, 8.5], [8.5, 8.5]]


# ---- horovod's optimizer bookkeeping under grad_accum and compile=true: a fake horovod (tests/fake_horovod.py)

def _horovod_on_fake(monkeypatch: pytest.MonkeyPatch, strategy: Any, grad_accum: int,
                     level: AmpConfig | None = None) -> tuple[nn.Module, Any, Amp]:
    """The strategy's model and horovod optimizer, built by its setup_module on the fake; setup() would join a
    real horovod world: only its device part runs (Strategy.setup), given what the worker passes."""
    fake_horovod.install(monkeypatch)
    Strategy.setup(strategy, RankEnv(0, 0, 2, CPU2, 60, grad_accum))
    strategy._grad_accum = grad_accum  # what setup(env) keeps from RankEnv.grad_accum
    torch.manual_seed(0)
    amp = build_amp("amp.native.NativeAmp", resolve(level or AmpConfig(level="O0"), "cpu"),
                    torch.device("cpu"))
    model, optimizer = strategy.setup_module(nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), amp,
                                             OptimizerSpec(torch.optim.SGD, {"lr": 0.1}))
    return model, optimizer, amp


def _steps(model: nn.Module, optimizer: Any, amp: Amp, strategy: Any, grad_accum: int, compile_first: bool) -> None:
    batches = [(torch.randn(4, 4), torch.tensor([0, 1, 2, 0])) for _ in range(3)]
    if compile_first:  # the model is not compiled: the pass's bookkeeping is what horovod objects to
        compile_pass(model, amp, optimizer, batches[0], grad_accum, contextlib.nullcontext, strategy.after_compile_pass)
    source = iter(batches[1:])
    clock = WindowClock(lambda: None, 0)
    train(model, optimizer, amp, types.SimpleNamespace(next=lambda: next(source)), clock, 2, 1,
          grad_accum=grad_accum, no_sync=functools.partial(no_sync_for, strategy, model))


@pytest.mark.parametrize("grad_accum", [1, 2, 4])
def test_horovod_reduces_once_per_step_whatever_grad_accum(monkeypatch, grad_accum):
    """backward_passes_per_step = grad_accum: each parameter's allreduce starts at the step's last micro-batch;
    with the default 1, horovod raises at the second ("Gradients were computed more than
    backward_passes_per_step times")."""
    strategy = HorovodStrategy()
    model, optimizer, amp = _horovod_on_fake(monkeypatch, strategy, grad_accum)
    _steps(model, optimizer, amp, strategy, grad_accum, compile_first=False)
    # 2 steps x (weight, bias): 4 allreduces, not 4 x grad_accum (one per micro-batch)
    assert Counter(fake_horovod.ALLREDUCES) == {"1.weight": 2, "1.bias": 2}


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_horovod_compile_pass_leaves_no_pending_allreduce(monkeypatch, grad_accum, recwarn):
    """The compile pass's backward starts allreduces that no step collects; horovod's zero_grad refuses them
    ("zero_grad() was called after loss.backward() but before optimizer.step() or optimizer.synchronize()").
    The strategy synchronizes them (3 reductions per parameter: the pass's and two steps'), and the first
    timed step's warning about synchronize() without skip_synchronize() is not shown."""
    strategy = HorovodStrategy()
    model, optimizer, amp = _horovod_on_fake(monkeypatch, strategy, grad_accum)
    _steps(model, optimizer, amp, strategy, grad_accum, compile_first=True)
    assert Counter(fake_horovod.ALLREDUCES) == {"1.weight": 3, "1.bias": 3}
    assert not [w for w in recwarn if "skip_synchronize" in str(w.message)]


def test_horovod_compile_pass_at_o2_leaves_the_master_weights_alone(monkeypatch):
    """At O2 horovod's optimizer steps the fp32 masters, which backward never reaches (no hook fires, nothing is
    pending): the pass has nothing to synchronize, and synchronize() would read their missing gradients
    (AttributeError). Each step then reduces the masters once: 2 steps x 2 parameters."""
    strategy = HorovodStrategy()
    model, optimizer, amp = _horovod_on_fake(monkeypatch, strategy, 1, AmpConfig(level="O2", dtype="bfloat16"))
    _steps(model, optimizer, amp, strategy, 1, compile_first=True)
    assert Counter(fake_horovod.ALLREDUCES) == {"allreduce.noname.0": 2, "allreduce.noname.1": 2}


def test_ignite_horovod_backend_passes_grad_accum_and_settles_the_compile_pass(monkeypatch):
    """strategy=ignite strategy.backend=horovod: idist.auto_optim hands its keywords to horovod's optimizer
    (ignite/distributed/auto.py, auto_optim: `optimizer = hvd.DistributedOptimizer(optimizer, **kwargs)`)."""
    from strategies.ignite import IgniteStrategy

    def auto_optim(optimizer: Any, **kwargs: Any) -> Any:
        import horovod.torch as hvd

        return hvd.DistributedOptimizer(optimizer, **kwargs)

    idist = types.SimpleNamespace(get_world_size=lambda: 2, auto_model=lambda model, **kw: model,
                                  auto_optim=auto_optim)
    monkeypatch.setattr("strategies.ignite._idist", lambda: idist)
    strategy = IgniteStrategy(backend="horovod")
    strategy._device = torch.device("cpu")  # what setup() takes from idist.device()
    model, optimizer, amp = _horovod_on_fake(monkeypatch, strategy, 2)
    _steps(model, optimizer, amp, strategy, 2, compile_first=True)
    # auto_optim names no parameters: horovod's own names; the pass's and two steps' reductions, not 2 x 2 + 2
    assert Counter(fake_horovod.ALLREDUCES) == {"allreduce.noname.0": 3, "allreduce.noname.1": 3}
