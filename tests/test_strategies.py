"""strategies.base: the base class owns the set-up order, a strategy overrides phases. A plugin whose wrapper
replaces the parameters (tests/plugins/late_optimizer.py) needs nothing but its own class and options."""

from __future__ import annotations

import pytest
import torch
from conftest import rank_spec, start_ranks

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
    from strategies.base import SingleProcessStrategy

    calls: list[str] = []

    class Recording(SingleProcessStrategy):
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


def test_a_strategy_must_say_how_its_ranks_line_up_and_agree():
    """barrier and max_over_ranks are abstract: a default that did nothing let a multi-process strategy that forgot
    them time one rank instead of the slowest, with no barrier at the windows' edges. One process says so by its
    base (SingleProcessStrategy), a process group by its own (ProcessGroupStrategy)."""
    from torch import nn

    from harness.core.traffic import Traffic
    from strategies.base import ProcessGroupStrategy, SingleProcessStrategy, Strategy

    class Unsynchronised(Strategy):
        one_process_per_device = True

        @classmethod
        def traffic(cls, options):
            return Traffic()

        def wrap(self, model: nn.Module) -> nn.Module:
            return model

    with pytest.raises(TypeError, match=r"abstract methods? .*barrier.*max_over_ranks"):
        Unsynchronised()
    own = {"traffic": classmethod(lambda cls, options: Traffic()), "wrap": lambda self, model: model}
    type("Grouped", (ProcessGroupStrategy,), own)()  # the same two are all a process group's strategy needs
    alone = type("Alone", (SingleProcessStrategy,), own)()
    alone.barrier()
    assert alone.max_over_ranks(2.5) == 2.5  # nobody else to ask


def test_a_capability_is_not_met_by_the_base_class_default():
    """A mixin comes before the base class: a sharding strategy that forgets full_parameters cannot be built (after
    the base, Strategy.full_parameters, the unsharded default, would have stood in for it, silently)."""
    from harness.core.traffic import Traffic
    from strategies.base import ProcessGroupStrategy
    from strategies.capabilities import ShardedParameters

    class Forgetful(ShardedParameters, ProcessGroupStrategy):
        @classmethod
        def traffic(cls, options):
            return Traffic()

        def wrap(self, model):
            return model

        def unit_names(self, model):
            return []

    with pytest.raises(TypeError, match="full_parameters"):
        Forgetful()


def shipped_strategies() -> dict[str, type]:
    """Every strategy class there is: those conf/strategy/ names, the collectives' bare group, the test plugins."""
    from plugins.late_optimizer import EarlyOptimizer, LateOptimizer
    from plugins.unaveraged import SummedGradients

    from strategies.base import BareProcessGroup
    from strategies.compat import strategy_classes

    return {**strategy_classes(), "bare": BareProcessGroup, "late": LateOptimizer, "early": EarlyOptimizer,
            "summed": SummedGradients}


def test_every_strategy_lines_up_its_ranks_as_its_processes_are_laid_out():
    """One process: SingleProcessStrategy's answers. One process per device: a process group's (torch.distributed,
    or Ignite's own context), never a single process's."""
    from strategies.base import SingleProcessStrategy

    for name, cls in shipped_strategies().items():
        assert not cls.__abstractmethods__, name
        one_process = issubclass(cls, SingleProcessStrategy)
        assert one_process != cls.one_process_per_device, name
        if not one_process:
            assert cls.barrier is not SingleProcessStrategy.barrier, name
            assert cls.max_over_ranks is not SingleProcessStrategy.max_over_ranks, name


WORLD = 2


def _rank_max(rank: int, ports: dict[str, int], out: str) -> None:
    """Each multi-process strategy set up in turn over gloo, asked for the largest of the ranks' values."""
    import json
    import os
    from pathlib import Path

    from conftest import leave_at_once
    from test_allreduce import cpu_placement

    from harness.launch.launcher import loopback_interface
    from strategies.base import RankEnv

    torch.set_num_threads(1)
    classes, found = shipped_strategies(), {}
    for name, port in ports.items():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD), GLOO_SOCKET_IFNAME=loopback_interface())
        strategy = classes[name]()
        strategy.setup(RankEnv(rank, rank, WORLD, cpu_placement(), timeout_s=60))
        try:
            found[name] = strategy.max_over_ranks(10.0 * rank + 1.5)
            strategy.barrier()
        finally:
            strategy.teardown()
    Path(out, f"rank{rank}.json").write_text(json.dumps(found))
    leave_at_once()


@pytest.mark.slow
def test_every_multi_process_strategy_takes_the_slowest_ranks_value(tmp_path):
    """iterations=auto decides on max_over_ranks: on every rank, every shipped multi-process strategy answers the
    largest value any rank holds (rank 1's here), not its own. Those whose set-up needs a package missing here
    (horovod's own rendezvous) are left out; apex_ddp sets up as DDP does and is asked too."""
    import json

    from test_modern import free_port

    from strategies.base import ProcessGroupStrategy

    multi = {name: cls for name, cls in shipped_strategies().items() if cls.one_process_per_device
             and (cls.unavailable_reason() is None or cls.setup is ProcessGroupStrategy.setup)}
    assert {"ddp", "zero", "fsdp", "allreduce", "apex_ddp", "bare", "summed"} <= set(multi)
    start_ranks(_rank_max, ({name: free_port() for name in multi}, str(tmp_path)), WORLD)
    for rank in range(WORLD):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == {name: 11.5 for name in multi}, rank


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
