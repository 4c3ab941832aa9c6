"""harness.runner: what is decided before launch (refusals, fresh processes), how the memory section falls
back, and to whom an error is attributed."""

from __future__ import annotations

import os

import pytest
from conftest import run_config
from test_memory import FakeNvml, mib

from harness.config import Incompatible
from harness.devices import Hardware
from harness.memory import MemorySampler, NvmlSource
from harness.runner import memory_section, plan

ONE_GPU = Hardware(visible_gpus=(0,), cores=8)
TWO_GPUS = Hardware(visible_gpus=(0, 1), cores=8)
cfg_for = run_config


@pytest.mark.parametrize("level", ["O0", "O2", "O3"])
def test_dataparallel_with_apex_amp_that_patches_forward_is_refused(level):
    with pytest.raises(Incompatible) as info:
        plan(cfg_for("dp", amp={"level": level, "impl": "apex"}), TWO_GPUS)
    assert info.value.key == "amp.impl" and "replica" in str(info.value)


def test_dataparallel_with_apex_o1_is_allowed():
    assert plan(cfg_for("dp", amp={"level": "O1", "impl": "apex"}), TWO_GPUS).placement.nprocs == 1


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_apex_ddp_with_bfloat16_weights_is_refused(level):
    with pytest.raises(Incompatible) as info:
        plan(cfg_for("apex_ddp", amp={"level": level, "dtype": "bfloat16"}), TWO_GPUS)
    assert info.value.key == "amp.dtype" and "bfloat16" in str(info.value)
    # float16 weights, or bfloat16 only inside autocast (O1, fp32 weights), are what apex DDP reduces
    plan(cfg_for("apex_ddp", amp={"level": level, "dtype": "float16"}), TWO_GPUS)
    plan(cfg_for("apex_ddp", amp={"level": "O1", "dtype": "bfloat16"}), TWO_GPUS)


def test_fork_is_refused_with_cuda_and_allowed_on_cpu():
    fork = {"name": "spawn", "start_method": "fork"}
    with pytest.raises(Incompatible) as info:
        plan(cfg_for("ddp", launcher=fork, batch_size=2), TWO_GPUS)
    assert info.value.key == "launcher.start_method" and "CUDA" in str(info.value)
    assert plan(cfg_for("ddp", launcher=fork, gpus=[], batch_size=2), TWO_GPUS).placement.accelerator == "cpu"
    assert plan(cfg_for("ddp", launcher={"name": "spawn", "start_method": "forkserver"}, batch_size=2), TWO_GPUS)


@pytest.mark.parametrize(("strategy", "repeat", "in_sweep", "launched"), [
    ("single", 1, False, False),  # a single run of a one-process strategy runs inside the launcher
    ("single", 2, False, True),  # repeats: each in a fresh process (no inherited CUDA context or cached blocks)
    ("single", 1, True, True),
    ("dp", 3, False, True),
    ("ddp", 1, False, True),
])
def test_which_runs_get_fresh_processes(strategy, repeat, in_sweep, launched):
    decided = plan(cfg_for(strategy, repeat=repeat), ONE_GPU, in_sweep=in_sweep)
    assert decided.launched is launched
    assert decided.placement.torch_indices == (0,)


def test_memory_falls_back_to_the_allocator_when_nvml_took_no_sample():
    """NVML opened, then every query refused (MIG without privileges): before, results said 0 MiB from nvml."""
    fake = FakeNvml(used={0: mib(100)}, procs={}, deny=("memory",))
    sampler = MemorySampler(NvmlSource([0], nvml=fake), interval_s=3600).start()
    sampler.stop()
    records = [{"rank": 0, "pid": 11, "device": "cuda:0", "host": "h",
                "allocator": [{"device": "cuda:0", "max_allocated_mib": 700.0, "max_reserved_mib": 812.5}]}]
    memory = memory_section(sampler, ("cuda:0",), records, os.getpid(), None)
    assert memory["source"] == "torch-allocator"
    assert memory["per_device"] == [{"device": "cuda:0", "peak_mib": 812.5, "baseline_mib": 0.0}]
    assert "Insufficient Permissions" in memory["warning"]
