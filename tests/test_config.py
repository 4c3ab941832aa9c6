"""harness.core.config: every Hydra group option composes into a valid RunConfig; bad input is one ConfigError."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from conftest import CONF_DIR, REPO
from hydra.utils import get_class, get_object

from harness.cli import group_options
from harness.compose import compose_one, has_gpu, hydra_context
from harness.core.config import RunConfig
from harness.core.errors import ConfigError

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")


def compose_run(*overrides: str) -> RunConfig:
    with hydra_context():
        return compose_one(overrides).run


def compose_dict(*overrides: str) -> dict[str, Any]:
    with hydra_context():
        return compose_one(overrides).config


GROUP_OPTIONS = [(group, option) for group in GROUPS for option in group_options(group, CONF_DIR)]


def test_every_group_has_options():
    # experiment may be empty; the four groups every run composes from may not.
    for group in ("strategy", "amp", "model", "data"):
        assert group_options(group, CONF_DIR), group


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_every_group_option_composes_into_a_run_config(group, option):
    yours = {"model": "model._target_=examples.custom_workload.build",  # the user's own: given on the command line
             "data": "data._target_=examples.custom_workload.batches"}
    if option == "tokens":  # its file is the user's too
        yours["data"] = f"data.file={REPO / 'README.md'}"  # any file: composing reads no token from it
    run = compose_run(f"{group}={option}", *([yours[group]] if option in ("custom", "tokens") else []))
    if group == "strategy":
        assert run.strategy_name == option
    if group == "amp":
        assert run.amp.level == option
    if group in ("model", "data"):
        assert run.model_name and run.data.image_size > 0
    # the targets the worker instantiates exist (a typo in a yaml would only show inside a worker)
    assert isinstance(get_class(run.strategy["_target_"]), type)
    assert callable(get_object(run.model["_target_"])) and callable(get_object(run.optim["_target_"]))
    assert isinstance(get_class(run.amp_plugin), type)


def test_default_config_is_cpu_sized_without_a_gpu():
    if has_gpu():
        pytest.skip("CPU defaults only apply on a machine without GPUs")
    run = compose_run()
    assert (run.model_name, run.data.image_size, run.batch_size, run.iterations) == ("shufflenet_v2_x0_5", 32, 32, 40)
    assert run.strategy_name == "single" and run.amp.level == "O0"


def test_explicit_override_beats_hw_default():
    run = compose_run("model=tiny_cnn", "batch_size=6", "data.image_size=12")
    assert (run.model_name, run.batch_size, run.data.image_size) == ("tiny_cnn", 6, 12)


def test_gpus_list_becomes_a_tuple():
    run = compose_run("gpus=[0,1,3]")
    assert run.gpus == (0, 1, 3)


@pytest.fixture(scope="module")
def base_cfg() -> dict[str, Any]:
    return compose_dict("strategy=ddp", "model=tiny_cnn", "batch_size=8", "iterations=40", "log_every=20")


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
    ("strategy.bucket_cap_mb", "abc"),  # checked against the plugin's own signature
    ("strategy.no_such_option", 1),
    ("optim.lr", "abc"),
    ("optim.lrr", 0.1),
    ("model.width", 2.5),
    ("model.foo", 1),
    ("timing.precision_pct", 0),
    ("report.baseline", 3),
    ("launcher.start_method", "clone"),
])
def test_bad_value_is_one_config_error_naming_the_key(base_cfg, key, value):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(with_value(base_cfg, key, value), "single")
    error = info.value
    assert error.key == key
    message = str(error)
    assert message.startswith(f"{key}=") and "not allowed" in message
    assert "\n" not in message


def test_fault_settings_checked_only_when_a_fault_is_asked_for(base_cfg):
    off = with_value(base_cfg, "fault", {"kind": None, "rank": -3, "at_iter": 10_000})
    assert RunConfig.from_dict(off, "single").fault.kind is None
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(with_value(base_cfg, "fault", {"kind": "raise", "rank": 0, "at_iter": 41}), "single")
    assert info.value.key == "fault.at_iter"


def test_unknown_key_in_a_section_is_refused(base_cfg):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(with_value(base_cfg, "amp.loss_scael", 128), "single")
    assert info.value.key == "amp.loss_scael"
    assert "loss_scale" in str(info.value)


def test_good_values_are_kept(base_cfg):
    cfg = with_value(with_value(base_cfg, "amp", {"_target_": "amp.native.NativeAmp", "level": "O2",
                                                  "impl": "native", "dtype": "float16", "loss_scale": 128,
                                                  "keep_batchnorm_fp32": False, "master_weights": True}), "seed", 7)
    run = RunConfig.from_dict(cfg, "single")
    assert run.amp.level == "O2" and run.amp.loss_scale == 128 and run.amp.keep_batchnorm_fp32 is False
    assert run.seed == 7 and run.iterations == 40 and run.log_every == 20 and run.gpus is None


def test_unknown_top_level_key_names_the_closest():
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict({**compose_dict(), "stratgy": "ddp"}, "single")
    assert info.value.key == "stratgy" and "did you mean strategy?" in str(info.value)


@pytest.mark.parametrize(("section", "value", "line"), [
    ("launcher", {"name": "nope", "start_method": "spawn"}, "launcher.name=nope is not allowed: one of elastic, spawn"),
    ("launcher", {"name": "spawn", "start_method": "x"}, "launcher.start_method=x is not allowed: one of spawn, fork, "
                                                         "forkserver"),
    ("fault", {"kind": "boom"}, "fault.kind=boom is not allowed: one of raise, exit, oom or null"),
    ("parity", {"reference": "x"}, "parity.reference=x is not allowed: one of O0, same_amp"),
    ("plan", {"calibration": "x"}, "plan.calibration=x is not allowed: one of strategy, model"),
    ("data", {"name": "x", "image_size": 8, "num_classes": 10}, "data.name=x is not allowed: one of synthetic, loader, tokens, custom"),
])
def test_allowed_values_are_the_fields_literal_types(section, value, line):
    """One place says what a key allows: its field's Literal type, which the record check reads (no tuple beside
    it to keep in step)."""
    from conftest import config_dict

    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(config_dict("single", **{section: value}), "single")
    assert str(info.value) == line


@pytest.mark.parametrize(("key", "value", "line"), [
    ("timing.busy_share", 0, "timing.busy_share=0 is not allowed: a share of the cores, > 0 and <= 1 (1: a run is never "
                             "counted busy)"),
    ("timing.budget_s", float("inf"), "timing.budget_s=inf is not allowed: a number > 0 (seconds a sweep may spend on "
                                      "rounds after its first two)"),
    ("verdict.margin", 1, "verdict.margin=1 is not allowed: a share > 0 and < 1 (0.05: equivalent within 5 %)"),
    ("search.prune_factor", 0.5, "search.prune_factor=0.5 is not allowed: a number >= 1 (2: combinations predicted "
                                 "more than twice as slow as the best are not run)"),
    ("plan.nodes", -1, "plan.nodes=-1 is not allowed: an integer >= 1 (or 0: the preset's own node count)"),
    ("after", -1, "after=-1 is not allowed: a combination's job number (an integer >= 0), set by the sweep"),
    ("repeat", 0, "repeat=0 is not allowed: an integer >= 1 or null"),
    ("warmup_windows", 1.5, "warmup_windows=1.5 is not allowed: an integer >= 0"),
    ("memory.enabled", 1, "memory.enabled=1 is not allowed: true or false"),
    ("timing", 5, "timing=5 is not allowed: the section (timing.precision_pct, timing.max_seconds, timing.budget_s, "
                  "timing.busy_share)"),
    ("search", "yes", "search=yes is not allowed: true, false, or the section (search.enabled, search.axes, "
                      "search.prune_factor, search.budget_s)"),
])
def test_each_key_is_read_by_its_field(base_cfg, key, value, line):
    """One walk over the records' fields: each key's type, then the range its field declares, worded by the field."""
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(with_value(base_cfg, key, value), "single")
    assert str(info.value) == line


def test_a_section_may_be_its_switch_or_left_out(base_cfg):
    cfg = {k: v for k, v in base_cfg.items() if k not in ("timing", "memory")}
    run = RunConfig.from_dict({**cfg, "parity": True, "search": False}, "single")
    assert run.parity.enabled and not run.search.enabled and run.timing == type(run.timing)()


def test_composing_refuses_a_bad_choice_in_the_harness_words():
    """A Literal field is an Enum-typed node in Hydra's defaults: composition itself fails, with the check's line as
    the cause; what composes reaches the records as plain strings."""
    from hydra import compose

    with hydra_context():
        for override, line in [("kernels.matmul_precision=fast", "kernels.matmul_precision=fast is not allowed: one "
                                "of highest, high, medium"),
                               ("fault.kind=1.5", "fault.kind=1.5 is not allowed: one of raise, exit, oom or null"),
                               ("data.name=disk", "data.name=disk is not allowed: one of synthetic, loader, tokens, "
                                "custom")]:
            with pytest.raises(Exception) as info:  # noqa: B017 (Hydra's own exception, ours as its cause)
                compose(config_name="config", overrides=[override])
            causes = []
            cause: BaseException | None = info.value
            while cause is not None:
                causes.append(cause)
                cause = cause.__cause__ or cause.__context__
            assert line in [str(c) for c in causes if isinstance(c, ConfigError)], override
            with pytest.raises(ConfigError, match=f"^{re.escape(line)}$"):
                compose_one([override])
    run = compose_run("kernels.matmul_precision=high", "parity=true", "fault.kind=raise")
    assert type(run.kernels.matmul_precision) is str and run.kernels.matmul_precision == "high"
    assert run.parity.enabled and type(run.fault.kind) is str


def test_the_docs_table_is_the_fields():
    """docs/config.md's table of keys is generated from the fields' help and defaults: it cannot drift."""
    from harness.core import config_docs

    text = config_docs.DOC.read_text()
    assert config_docs.generated(text) == text, "run: python -m harness.core.config_docs"
    keys = [key for key, _, _ in config_docs.rows()]
    assert {"search.axes", "search.budget_s", "timing.budget_s", "plan.calibration", "data._target_"} <= set(keys)
    assert len(keys) == len(set(keys))
