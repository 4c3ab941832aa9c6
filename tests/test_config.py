"""harness.config: every Hydra group option composes into a valid RunConfig; bad input is one ConfigError."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from conftest import CONF_DIR
from hydra import compose, initialize_config_dir
from hydra.utils import get_class, get_object
from omegaconf import OmegaConf

from harness import cli
from harness.config import CONFIG_GROUPS, ConfigError, RunConfig, check_group_choices, group_options


def compose_dict(*overrides: str) -> dict[str, Any]:
    cli.register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


GROUP_OPTIONS = [(group, option) for group in CONFIG_GROUPS for option in group_options(group, CONF_DIR)]


def test_every_group_has_options():
    # experiment may be empty; the four groups every run composes from may not.
    for group in ("strategy", "amp", "model", "data"):
        assert group_options(group, CONF_DIR), group


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_every_group_option_composes_into_a_run_config(group, option):
    cfg_dict = compose_dict(f"{group}={option}")
    run = RunConfig.from_dict(cfg_dict)
    if group == "strategy":
        assert run.strategy_name == option
    if group == "amp":
        assert run.amp.level == option
    if group in ("model", "data"):
        assert run.model_name and run.data.image_size > 0
    # the targets the worker instantiates exist (a typo in a yaml would only show inside a worker)
    assert isinstance(get_class(run.strategy["_target_"]), type)
    assert callable(get_object(run.model["_target_"]))


def test_default_config_is_cpu_sized_without_a_gpu():
    if cli.has_gpu():
        pytest.skip("CPU defaults only apply on a machine without GPUs")
    run = RunConfig.from_dict(compose_dict())
    assert (run.model_name, run.data.image_size, run.batch_size) == ("resnet18", 32, 32)
    assert run.strategy_name == "single" and run.amp.level == "O0"


def test_explicit_override_beats_hw_default():
    run = RunConfig.from_dict(compose_dict("model=tiny_cnn", "batch_size=6", "data.image_size=12"))
    assert (run.model_name, run.batch_size, run.data.image_size) == ("tiny_cnn", 6, 12)


def test_gpus_list_becomes_a_tuple():
    run = RunConfig.from_dict(compose_dict("gpus=[0,1,3]"))
    assert run.gpus == (0, 1, 3)


@pytest.fixture(scope="module")
def base_cfg() -> dict[str, Any]:
    return compose_dict("model=tiny_cnn", "batch_size=8", "iterations=40", "log_every=20")


def with_value(cfg: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(cfg)
    *parents, leaf = dotted.split(".")
    node = cfg
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return cfg


@pytest.mark.parametrize(("key", "value"), [
    ("amp.level", "O4"),
    ("amp.impl", "cuda"),
    ("amp.dtype", "int8"),
    ("amp.loss_scale", -1),
    ("amp.loss_scale", float("inf")),
    ("amp.loss_scale", True),
    ("amp.keep_batchnorm_fp32", "yes"),
    ("amp.master_weights", 1.5),
    ("data.image_size", 0),
    ("gpus", "0,1"),
    ("gpus", [0, -1]),
    ("gpus", [0, 0]),
    ("gpus", [True]),
    ("nprocs", 0),
    ("nprocs", 10_000),
    ("batch_size", 2.5),
    ("iterations", 30),  # not a multiple of log_every=20
    ("iterations", 10),  # fewer than log_every
    ("log_every", True),
    ("warmup_windows", -1),
    ("memory.interval_ms", 0),
    ("memory.interval_ms", "fast"),
    ("dist.timeout_s", 0),
    ("dist.timeout_s", "abc"),
    ("dist.timeout_s", float("nan")),
    ("dist.start_timeout_s", -5),
    ("seed", "abc"),
    ("fault.kind", "segfault"),
])
def test_bad_value_is_one_config_error_naming_the_key(base_cfg, key, value):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(with_value(base_cfg, key, value))
    error = info.value
    assert error.key == key
    message = str(error)
    assert message.startswith(f"{key}=") and "not allowed" in message
    assert "\n" not in message


def test_fault_settings_checked_only_when_a_fault_is_asked_for(base_cfg):
    off = with_value(base_cfg, "fault", {"kind": None, "rank": -3, "at_iter": 10_000})
    assert RunConfig.from_dict(off).fault.kind is None
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(with_value(base_cfg, "fault", {"kind": "raise", "rank": 0, "at_iter": 41}))
    assert info.value.key == "fault.at_iter"


def test_unknown_key_in_a_section_is_refused(base_cfg):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(with_value(base_cfg, "amp.loss_scael", 128))
    assert info.value.key == "amp.loss_scael"
    assert "loss_scale" in str(info.value)


def test_good_values_are_kept(base_cfg):
    cfg = with_value(with_value(base_cfg, "amp", {"level": "O2", "impl": "native", "dtype": "float16",
                                                  "loss_scale": 128, "keep_batchnorm_fp32": False,
                                                  "master_weights": True}), "seed", 7)
    run = RunConfig.from_dict(cfg)
    assert run.amp.level == "O2" and run.amp.loss_scale == 128 and run.amp.keep_batchnorm_fp32 is False
    assert run.seed == 7 and run.iterations == 40 and run.log_every == 20 and run.gpus is None


@pytest.mark.parametrize("override", ["strategy=nope", "amp=O4", "+model=vgg", "strategy=ddp,nope"])
def test_unknown_group_choice_is_refused_before_composing(override):
    with pytest.raises(ConfigError) as info:
        check_group_choices([override], CONF_DIR)
    group = override.lstrip("+").split("=")[0]
    assert info.value.key == group
    for option in group_options(group, CONF_DIR):
        assert option in info.value.allowed


@pytest.mark.parametrize("override", ["strategy=ddp", "amp=O0,O1,O2,O3", "batch_size=3", "experiment=null",
                                      "strategy=glob(*)", "hydra.run.dir=x=y"])
def test_valid_or_non_group_overrides_pass_the_precheck(override):
    check_group_choices([override], CONF_DIR)
