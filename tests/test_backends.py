"""The backends beyond gloo and nccl (MPI, Horovod, XLA): refused before anything starts where they cannot
run, with the reason found on this machine's packages; a sweep records them as skipped rows."""

from __future__ import annotations

import json
import sys

import pytest
import torch.distributed as dist
from conftest import TINY
from hydra.utils import get_class

from harness.compose import compose_one, hydra_context
from harness.core.errors import Incompatible
from harness.launch.decide import plan_from_dict
from harness.launch.decide import run_plan as plan
from harness.launch.placement import probe_hardware
from harness.launch.runner import execute
from strategies.horovod import HorovodStrategy
from strategies.xla import XlaStrategy


def composed(*overrides: str):  # noqa: ANN201
    with hydra_context():
        return compose_one([*overrides, "nprocs=2", *TINY, "iterations=40", "log_every=20"])


def run_config(*overrides: str):  # noqa: ANN201
    from harness.core.config import RunConfig

    result = composed(*overrides)
    return RunConfig.from_dict(result.config, result.strategy_name)


@pytest.mark.skipif(dist.is_mpi_available(), reason="this torch has MPI")
@pytest.mark.parametrize("strategy", ["ddp", "ignite"])
def test_mpi_is_refused_with_the_reason_on_a_torch_without_it(strategy):
    with pytest.raises(Incompatible, match=r"strategy.backend=mpi .*built without MPI \(torch.distributed."
                                           r"is_mpi_available\(\) is False"):
        plan(run_config(f"strategy={strategy}", "strategy.backend=mpi", "gpus=[]"), probe_hardware())


def test_nccl_is_refused_on_the_cpu():
    with pytest.raises(Incompatible, match="strategy.backend=nccl .*only on CUDA GPUs"):
        plan(run_config("strategy=ddp", "strategy.backend=nccl", "gpus=[]"), probe_hardware())


@pytest.mark.parametrize("strategy", ["ddp", "zero"])  # zero takes DDP's options, the backend included
def test_gloo_asked_for_by_name_is_accepted(strategy):
    cfg = run_config(f"strategy={strategy}", "strategy.backend=gloo", "gpus=[]")
    assert plan(cfg, probe_hardware()).launched
    assert get_class(cfg.strategy["_target_"])(**{k: v for k, v in cfg.strategy.items() if k != "_target_"}
                                                ).backend == "gloo"


@pytest.mark.skipif(sys.modules.get("torch_xla") is not None, reason="torch_xla is imported here")
def test_ignite_xla_tpu_is_refused_with_what_the_packages_say():
    with pytest.raises(Incompatible, match="strategy.backend=xla-tpu .*xmp.spawn") as info:
        plan(run_config("strategy=ignite", "strategy.backend=xla-tpu", "gpus=[]"), probe_hardware())
    if XlaStrategy.unavailable_reason():
        assert "torch_xla is not installed" in str(info.value)
    else:  # the XLA environment: the missing function is named with both versions
        assert "xm.xrt_world_size()" in str(info.value)


@pytest.mark.skipif(HorovodStrategy.unavailable_reason() is None, reason="horovod is installed here")
def test_ignite_horovod_without_horovod_is_refused_with_the_build_line():
    with pytest.raises(Incompatible, match="strategy.backend=horovod .*HOROVOD_WITH_PYTORCH=1"):
        plan(run_config("strategy=ignite", "strategy.backend=horovod", "gpus=[]"), probe_hardware())


def test_ignite_horovod_refuses_dynamic_loss_scaling_as_strategy_horovod_does():
    """GradScaler would unscale gradients horovod is still all-reducing in place: refused whether or not horovod
    is installed (the combination is wrong either way), with HorovodStrategy's own reason."""
    with pytest.raises(Incompatible, match="amp.loss_scale=dynamic is not allowed: .*with strategy=horovod at O1"):
        plan(run_config("strategy=ignite", "strategy.backend=horovod", "amp=O1", "amp.dtype=float16", "gpus=[]"),
             probe_hardware())
    with pytest.raises(Incompatible, match="amp.loss_scale=dynamic"):
        plan(run_config("strategy=horovod", "amp=O1", "amp.dtype=float16", "gpus=[]"), probe_hardware())
    plan(run_config("strategy=ignite", "strategy.backend=gloo", "amp=O1", "amp.dtype=float16", "gpus=[]"),
         probe_hardware())  # ignite's DDP scales as strategy=ddp does


@pytest.mark.parametrize(("strategy", "cls"), [("horovod", HorovodStrategy), ("xla", XlaStrategy)])
def test_a_sweep_without_the_package_records_a_skipped_row_with_the_recipe(strategy, cls, tmp_path):
    if cls.unavailable_reason() is None:
        pytest.skip(f"{strategy} can run here")
    result = composed(f"strategy={strategy}")
    results = execute(plan_from_dict(result.config, result.strategy_name, in_sweep=True), tmp_path / "run", in_sweep=True)
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results.status == written["status"] == "skipped"
    assert cls.unavailable_reason() in written["error"] and "docs/backends.md" in written["error"]


def test_xla_devices_follow_nprocs_unless_set():
    assert composed("strategy=xla").config["strategy"]["devices"] == 2
    assert composed("strategy=xla", "strategy.devices=1").config["strategy"]["devices"] == 1
