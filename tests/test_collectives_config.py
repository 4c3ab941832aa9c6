"""harness.collectives.config: the `collectives.*` checks, one line naming the key; placement without a batch."""

from __future__ import annotations

import pytest

from harness.collectives.arithmetic import OPS
from harness.collectives.config import CollectivesConfig, placement_for
from harness.core.errors import ConfigError
from harness.launch.placement import Hardware

MiB = 2**20
NO_GPU = Hardware(visible_gpus=(), cores=2)
FOUR_GPUS = Hardware(visible_gpus=(0, 1, 2, 3), cores=16)


# ---- configuration and placement ----

def test_config_from_ladder_and_from_list():
    cfg = CollectivesConfig.from_dict({"min_size": "4KiB", "max_size": "16KiB", "factor": 2, "ops": ["all_reduce"]})
    assert cfg.sizes == (4096, 8192, 16384) and cfg.ops == ("all_reduce",)
    cfg = CollectivesConfig.from_dict({"sizes": ["1MiB", "4KiB"], "ops": list(OPS), "warmup": 0, "repeats": 1})
    assert cfg.sizes == (4096, MiB)


@pytest.mark.parametrize(("section", "key"), [
    ({"ops": ["all_reduce", "nope"]}, "collectives.ops"),
    ({"ops": []}, "collectives.ops"),
    ({"ops": ["all_reduce"], "sizes": ["4XB"]}, "collectives.sizes"),
    ({"ops": ["all_reduce"], "factor": 1}, "collectives.factor"),
    ({"ops": ["all_reduce"], "min_size": "1MiB", "max_size": "4KiB"}, "collectives.max_size"),
    ({"ops": ["all_reduce"], "dtype": "int8"}, "collectives.dtype"),
    ({"ops": ["all_reduce"], "repeats": 0}, "collectives.repeats"),
    ({"ops": ["all_reduce"], "warmup": -1}, "collectives.warmup"),
    ({"ops": ["all_reduce"], "typo": 1}, "collectives.typo"),
    ({"ops": ["all_reduce"], "after_compute_ms": [2, 0]}, "collectives.after_compute_ms"),
    ({"ops": ["all_reduce"], "sizes": ["4KiB"], "after_compute_ms": [2], "after_compute_at": "8KiB"},
     "collectives.after_compute_at"),
])
def test_config_refuses(section, key):
    with pytest.raises(ConfigError) as error:
        CollectivesConfig.from_dict(section)
    assert error.value.key == key


def test_placement_like_ddp():
    cpu = placement_for({"gpus": None, "nprocs": 2}, NO_GPU)
    assert cpu.accelerator == "cpu" and cpu.world_size == 2 and cpu.devices == ("cpu:0", "cpu:1")
    gpu = placement_for({"gpus": [1, 3], "nprocs": 2}, FOUR_GPUS)
    assert gpu.accelerator == "cuda" and gpu.devices == ("cuda:1", "cuda:3")
    assert gpu.worker_env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert placement_for({"gpus": None, "nprocs": 2}, FOUR_GPUS).world_size == 4
    assert placement_for({"gpus": [], "nprocs": 3}, FOUR_GPUS).devices == ("cpu:0", "cpu:1", "cpu:2")
    with pytest.raises(ConfigError, match="gpus"):
        placement_for({"gpus": [7], "nprocs": 2}, FOUR_GPUS)
    with pytest.raises(ConfigError, match="dist.timeout_s"):
        placement_for({"gpus": None, "nprocs": 2, "dist": {"timeout_s": 0}}, NO_GPU)


def test_config_is_checked_as_every_section_is():
    """Unknown keys and wrong types go through harness.core.options' record check: the closest key, the type."""
    with pytest.raises(ConfigError) as error:
        CollectivesConfig.from_dict({"ops": ["all_reduce"], "repeat": 3})
    assert error.value.key == "collectives.repeat" and "did you mean collectives.repeats?" in str(error.value)
    with pytest.raises(ConfigError) as error:
        CollectivesConfig.from_dict({"ops": ["all_reduce"], "warmup": True})
    assert error.value.key == "collectives.warmup" and "an integer" in str(error.value)
    with pytest.raises(ConfigError) as error:
        CollectivesConfig.from_dict({"ops": ["all_reduce"], "fault": {"rank": 1, "sizes": "4KiB"}})
    assert error.value.key == "collectives.fault.sizes"
    cfg = CollectivesConfig.from_dict({"ops": "all_reduce", "sizes": "4KiB", "fault": {"rank": 1, "size": "4KiB"}})
    assert (cfg.ops, cfg.sizes, cfg.fault_rank, cfg.fault_size) == (("all_reduce",), (4096,), 1, 4096)
    assert (cfg.dtype, cfg.warmup, cfg.repeats) == ("float32", 2, 10)  # CollectivesSection's CPU defaults


def test_placement_has_no_training_batch_to_pass():
    """Three CPU workers: a fake batch of 3 is no longer needed; the placement's batch is one per worker."""
    p = placement_for({"gpus": [], "nprocs": 3}, NO_GPU)
    assert p.world_size == 3 and p.global_batch == 3 and p.local_batch == 1


def test_the_defaults_are_the_records_and_hydra_composes_them_from_there():
    """conf/collectives.yaml repeats no default: Hydra composes `collectives_defaults` from the records, whose CPU and
    GPU values stand in the fields once (repeats 10 on a CPU, 20 on GPUs)."""
    from hydra import compose
    from omegaconf import OmegaConf

    from harness.collectives.config import BenchmarkConfig, CollectivesSection, register_defaults
    from harness.compose import has_gpu, hydra_context
    from harness.core.config import CONF_DIR
    from harness.core.defaults import gpu_defaults

    assert gpu_defaults(CollectivesSection) == {"max_size": "256MiB", "warmup": 5, "repeats": 20}
    own = OmegaConf.load(CONF_DIR / "collectives.yaml")
    assert set(own) == {"defaults", "hydra"}
    register_defaults()
    with hydra_context():
        cfg = OmegaConf.to_container(compose(config_name="collectives"), resolve=True)
    assert set(cfg) == {"gpus", "nprocs", "dist", "collectives"} and cfg["dist"]["timeout_s"] == 120
    composed = CollectivesConfig.from_dict(cfg["collectives"])
    expected = BenchmarkConfig().collectives
    if not has_gpu():
        assert (composed.ops, composed.warmup, composed.repeats) == (tuple(expected.ops), expected.warmup, 10)
    assert placement_for(cfg, NO_GPU).world_size == 2
