"""hydra_plugins/harness_signature_source.py and harness.core.options.signature_defaults: a plugin option's
defaults are its signature's, composed by Hydra; the yaml sets only what the harness chooses otherwise."""

from __future__ import annotations

import inspect

import pytest
from conftest import CONF_DIR
from hydra.utils import get_object
from omegaconf import OmegaConf

from harness.cli import group_options
from harness.compose import compose_one, hydra_context
from harness.core.errors import ConfigError
from harness.core.options import option_target, signature_defaults

OPTIONS = [(group, option) for group in ("strategy", "model", "optim") for option in group_options(group, CONF_DIR)
           if (group, option) != ("model", "custom")]  # the user names the plugin: tests/test_workloads.py


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_every_keyword_is_composed_with_its_signature_default_unless_the_yaml_sets_it(group, option):
    own = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"))
    target = option_target(own)
    assert target is not None, f"conf/{group}/{option}.yaml names no plugin"
    with hydra_context():
        composed = compose_one([f"{group}={option}"]).config[group]
    assert composed["_target_"] == target
    for name, parameter in inspect.signature(get_object(target)).parameters.items():
        if parameter.default is inspect.Parameter.empty or name in own:
            continue
        default = list(parameter.default) if isinstance(parameter.default, tuple) else parameter.default
        assert composed[name] == default, f"{group}={option}: {name}"
    for name, value in own.items():  # the yaml's own choices win over the signature's
        if name != "defaults" and not str(value).startswith("${"):
            assert composed[name] == value, f"{group}={option}: {name}"
    # the yaml writes no default a second time: what it sets differs from the signature's default
    repeated = [k for k, v in own.items() if k in signature_defaults(target) and signature_defaults(target)[k] == v
                and k != "_target_"]
    assert not repeated, f"conf/{group}/{option}.yaml repeats its plugin's defaults: {repeated}"


def test_a_default_comes_from_the_signature_and_an_override_needs_no_plus():
    with hydra_context():
        assert compose_one(["strategy=ddp"]).config["strategy"]["bucket_cap_mb"] == 25  # TorchDDP's default
        assert compose_one(["strategy=ddp", "strategy.bucket_cap_mb=50"]).run.strategy["bucket_cap_mb"] == 50
        assert compose_one(["optim=sgd"]).config["optim"]["lr"] == 0.01  # the harness's, over torch's 1e-3
        with pytest.raises(ConfigError, match="did you mean strategy.bucket_cap_mb"):
            compose_one(["strategy=ddp", "strategy.bucket_cap_md=50"])


def test_only_keywords_yaml_can_spell_and_the_harness_does_not_pass_itself():
    def plugin(num_classes: int, width: int = 8, shape: tuple[int, int] = (2, 3), device: object = object(),
               *args: int, **kwargs: int) -> None:
        """num_classes: passed by the harness; device: no YAML for it."""

    import sys
    import types

    module = types.ModuleType("plugin_for_test")
    module.plugin = plugin  # type: ignore[attr-defined]
    sys.modules["plugin_for_test"] = module
    try:
        assert signature_defaults("plugin_for_test.plugin") == {"_target_": "plugin_for_test.plugin", "width": 8,
                                                                "shape": [2, 3]}
    finally:
        del sys.modules["plugin_for_test"]


def test_a_yaml_names_its_plugin_by_target_or_by_signature():
    assert option_target({"_target_": "a.B", "x": 1}) == "a.B"
    assert option_target({"defaults": ["/signature/a.B@_here_", "_self_"]}) == "a.B"
    assert option_target({"defaults": ["_self_"]}) is None


def test_a_plugin_that_does_not_import_is_one_line_naming_it():
    from hydra.plugins.config_source import ConfigLoadError

    from hydra_plugins.harness_signature_source import SignatureSource

    source = SignatureSource("test", "signature://")
    assert source.is_config("signature/strategies.ddp.TorchDDP.yaml") and not source.is_config("strategy/ddp")
    with pytest.raises(ConfigLoadError) as caught:
        source.load_config("signature/nope.Nope.yaml")
    assert "nope.Nope" in str(caught.value) and "\n" not in str(caught.value)
