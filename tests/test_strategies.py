"""strategies.base: the base class owns the set-up order, a strategy overrides phases. A plugin whose wrapper
replaces the parameters (tests/plugins/late_optimizer.py) needs nothing but its own class and options."""

from __future__ import annotations

import pytest
import torch
from conftest import rank_spec

from harness.rank.worker import run_rank


def final_and_first_loss(tmp_path, target: str) -> tuple[float, float]:
    spec = rank_spec(tmp_path / "ranks", "single", strategy={"_target_": target, "scale": 2.0}, gpus=[],
                     nprocs=1, batch_size=8, iterations=60, log_every=20, warmup_windows=1,
                     data={"name": "synthetic", "image_size": 8, "num_classes": 10, "pool": 1})  # one batch: learnt
    threads = torch.get_num_threads()
    try:
        record = run_rank(spec)
    finally:
        torch.set_num_threads(threads)
    assert record.status == "ok"
    losses = [w.loss for w in record.windows]
    return losses[-1], losses[0]


def test_a_strategy_can_build_its_optimizer_after_wrapping(tmp_path):
    last, first = final_and_first_loss(tmp_path, "plugins.late_optimizer.LateOptimizer")
    assert last < 0.9 * first  # the parameters in use are the ones the optimizer steps


def test_the_order_matters_so_the_check_above_can_fail(tmp_path):
    last, first = final_and_first_loss(tmp_path, "plugins.late_optimizer.EarlyOptimizer")
    assert last == first  # the optimizer steps parameters the wrapper does not use: nothing trains


def test_its_options_are_checked_against_its_own_signature():
    import pytest
    from conftest import run_config

    from harness.core.errors import ConfigError

    assert run_config(strategy={"_target_": "plugins.late_optimizer.LateOptimizer", "scale": 3}).strategy["scale"] == 3
    with pytest.raises(ConfigError, match="strategy.scale=big is not allowed: a number"):
        run_config(strategy={"_target_": "plugins.late_optimizer.LateOptimizer", "scale": "big"})


# ---- the phases of Strategy.setup_module: one order, one place that builds the optimizer ----

def test_setup_runs_every_phase_once_in_one_order_and_builds_the_optimizer_once():
    from torch import nn

    from amp import Amp, AmpConfig, OptimizerSpec, resolve
    from harness.core.traffic import Traffic
    from strategies.base import Strategy

    calls: list[str] = []

    class Recording(Strategy):
        @classmethod
        def traffic(cls, options):
            return Traffic()

        def convert_module(self, model):
            calls.append("convert")
            return model

        def place(self, model):
            calls.append("place")
            return model

        def apply_precision(self, model, amp):
            calls.append("precision")
            return super().apply_precision(model, amp)

        def shard(self, model, amp):
            calls.append("shard")
            return model

        def build_optimizer(self, params, optimizer):
            calls.append("optimizer")
            return super().build_optimizer(params, optimizer)

        def wrap(self, model):
            calls.append("wrap")
            return model

        def wrap_optimizer(self, model, optimizer):
            calls.append("wrap_optimizer")
            return optimizer

    class RecordingAmp(Amp):
        def cast_module(self, model):
            calls.append("amp.cast")
            return model

        def connect(self, model, optimizer):
            calls.append("amp.connect")
            return model, optimizer

    built: list[object] = []

    class Counted(torch.optim.SGD):
        def __init__(self, params, **kwargs):
            built.append(self)
            super().__init__(params, **kwargs)

    amp = RecordingAmp(resolve(AmpConfig("O0"), "cpu"), torch.device("cpu"))
    model, optimizer = Recording().setup_module(nn.Linear(2, 2), amp, OptimizerSpec(Counted, {"lr": 0.5}))
    assert calls == ["convert", "place", "precision", "amp.cast", "shard", "optimizer", "amp.connect", "wrap",
                     "wrap_optimizer"]
    assert built == [optimizer] and optimizer.defaults["lr"] == 0.5
    assert {id(p) for p in optimizer.param_groups[0]["params"]} == {id(p) for p in model.parameters()}


def test_the_optimizer_spec_is_the_configs_class_and_keywords():
    from amp import OptimizerSpec
    from harness.compose import compose_one, hydra_context

    with hydra_context():
        spec = OptimizerSpec.from_config(compose_one(["optim=adamw"]).config["optim"])
    assert spec.cls is torch.optim.AdamW
    assert {k: spec.kwargs[k] for k in ("lr", "betas", "weight_decay")} == {"lr": 0.001, "betas": [0.9, 0.999],
                                                                             "weight_decay": 0.01}  # torch's own
    assert "_partial_" not in spec.kwargs and "params" not in spec.kwargs


def test_zero_shards_the_configured_class_with_its_keywords(monkeypatch):
    """No functools.partial to take apart: ZeRO builds ZeroRedundancyOptimizer from the spec's class and
    keywords, as given (AdamW's weight decay included)."""
    import torch.distributed as dist
    from test_modern import free_port

    from amp import OptimizerSpec
    from strategies.zero import ZeroDDP

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        params = [torch.nn.Parameter(torch.ones(3))]
        optimizer = ZeroDDP().build_optimizer(params, OptimizerSpec(torch.optim.AdamW, {"lr": 0.1,
                                                                                        "weight_decay": 0.25}))
        assert type(optimizer).__name__ == "ZeroRedundancyOptimizer"
        assert type(optimizer.optim) is torch.optim.AdamW
        assert (optimizer.optim.defaults["lr"], optimizer.optim.defaults["weight_decay"]) == (0.1, 0.25)
    finally:
        dist.destroy_process_group()


def test_an_options_default_lives_once_in_the_signature():
    """The parent's checks (check_run, variant, lossy) see an option left out of the yaml at the constructor's
    default, with no default of their own to drift from it."""
    from strategies.ddp import TorchDDP

    assert TorchDDP.variant({"comm_hook": "powersgd"}) == "comm_hook=powersgd(rank 1)"  # powersgd_rank: int = 1

    class Wider(TorchDDP):
        def __init__(self, comm_hook: str = "powersgd", powersgd_rank: int = 4) -> None:
            super().__init__(comm_hook=comm_hook, powersgd_rank=powersgd_rank)

    assert Wider.variant({}) == "comm_hook=powersgd(rank 4)"
    assert Wider.lossy({"powersgd_rank": 2}).startswith("comm_hook=powersgd: gradients are sent as a rank-2 ")
    assert Wider.options_of({"_target_": "x.Wider", "comm_hook": "fp16"}) == {"comm_hook": "fp16", "powersgd_rank": 4}


def test_a_strategy_must_say_its_wrapper_and_its_traffic():
    """The two required hooks are abstract: a strategy that forgets one cannot be built, and the error names it
    (before, every hook had a silent default and a forgotten `traffic` predicted no communication at all)."""
    from torch import nn

    from strategies.base import Strategy

    class Forgetful(Strategy):
        def wrap(self, model: nn.Module) -> nn.Module:
            return model

    with pytest.raises(TypeError, match="traffic"):
        Forgetful()


def test_capabilities_are_mixins_the_rank_asks_for_not_names():
    """grad_accum's sync skip, sharded parameters and in-window compilation: only the strategies that have
    them say so; the rest run as if there were nothing to do."""
    import contextlib

    from strategies.capabilities import CompilesInWindows, GradientSyncControl, ShardedParameters, no_sync_for
    from strategies.ddp import TorchDDP
    from strategies.fsdp import FSDP2
    from strategies.horovod import HorovodStrategy
    from strategies.single import SingleDevice
    from strategies.xla import XlaStrategy
    from strategies.zero import ZeroDDP

    assert issubclass(TorchDDP, GradientSyncControl) and issubclass(ZeroDDP, GradientSyncControl)
    assert issubclass(FSDP2, ShardedParameters) and not issubclass(TorchDDP, ShardedParameters)
    assert issubclass(XlaStrategy, CompilesInWindows) and not issubclass(FSDP2, CompilesInWindows)
    assert not issubclass(HorovodStrategy, GradientSyncControl)  # horovod counts micro-batches in its optimizer
    assert isinstance(no_sync_for(SingleDevice(), None), contextlib.nullcontext)
