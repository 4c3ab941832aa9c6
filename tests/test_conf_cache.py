"""hydra_plugins/harness_conf_cache.py: conf/ parsed once per process, the same configs composed, and no other
Hydra app's search path touched."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hydra import initialize_config_dir
from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
from hydra._internal.core_plugins.file_config_source import FileConfigSource
from hydra._internal.sources_registry import SourcesRegistry

from harness.compose import compose_one, hydra_context
from hydra_plugins.harness_conf_cache import CONF_DIR, SCHEME, CachedConfSearchPath, CachedConfSource


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file Hydra's own file source parses from now on."""
    parsed: list[str] = []
    # Hydra registers its own copy of the file source class (its plugin scan loads the module again): both count
    for source in {FileConfigSource, SourcesRegistry.instance().resolve("file")}:
        def load(self: FileConfigSource, config_path: str, real: Any = source.load_config) -> object:
            parsed.append(config_path)
            return real(self, config_path)

        monkeypatch.setattr(source, "load_config", load)
    return parsed


def plain_conf(tmp_path: Path) -> Path:
    """A copy of conf/ elsewhere: Hydra's own file source serves it (the cache serves only conf/ itself)."""
    copy = tmp_path / "conf"
    shutil.copytree(CONF_DIR, copy)
    return copy


def test_a_second_composition_parses_no_file_again(monkeypatch, tmp_path):
    overrides = ["strategy=ddp", "amp=O1"]
    with hydra_context():
        first = compose_one([*overrides, "batch_size=16"])
        parsed = count_parses(monkeypatch)
        again = compose_one([*overrides, "batch_size=32"])
    assert parsed == []  # every file came from the first composition's parse
    assert again.config["batch_size"] == 32 and first.config["batch_size"] == 16  # no state leaks between them
    assert {k: v for k, v in again.config.items() if k != "batch_size"} == \
        {k: v for k, v in first.config.items() if k != "batch_size"}
    with initialize_config_dir(config_dir=str(plain_conf(tmp_path)), version_base="1.3"):
        compose_one([*overrides, "batch_size=32"])
    assert "config" in parsed and "strategy/ddp" in parsed  # without the cache: every file parsed again


def test_the_cached_composition_is_hydras_own(tmp_path):
    """The same config as Hydra's own file source composes from the same files."""
    overrides = ["strategy=fsdp", "model=gpt", "amp=O2", "optim=adamw"]
    with hydra_context():
        compose_one(overrides)
        cached = compose_one(overrides)
    with initialize_config_dir(config_dir=str(plain_conf(tmp_path)), version_base="1.3"):
        plain = compose_one(overrides)
    assert cached.config == plain.config and cached.choices == plain.choices


def test_a_loaded_config_edited_by_its_reader_leaves_the_cache_as_parsed(tmp_path):
    (tmp_path / "one.yaml").write_text("defaults:\n  - _self_\nvalue: 1\n")
    source = CachedConfSource(provider="test", path=f"{SCHEME}://{tmp_path}")
    loaded = source.load_config("one")
    del loaded.config["defaults"]  # what Hydra does to a loaded config
    assert "defaults" in source.load_config("one").config


def test_a_file_changed_on_disk_is_parsed_again(tmp_path):
    path = tmp_path / "one.yaml"
    path.write_text("value: 1\n")
    source = CachedConfSource(provider="test", path=f"{SCHEME}://{tmp_path}")
    assert source.load_config("one").config["value"] == 1
    path.write_text("value: 2\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert source.load_config("one").config["value"] == 2


@pytest.mark.parametrize("primary", [CONF_DIR, f"file://{CONF_DIR}"])
def test_only_the_harness_conf_folder_is_served_from_the_cache(tmp_path, primary):
    search_path = ConfigSearchPathImpl()
    search_path.append("main", primary)
    search_path.append("other-app", str(tmp_path))
    search_path.append("plugin", "pkg://somewhere.conf")
    CachedConfSearchPath().manipulate_search_path(search_path)
    assert [e.path for e in search_path.get_path()] == [f"{SCHEME}://{CONF_DIR}", str(tmp_path), "pkg://somewhere.conf"]


def test_another_apps_search_path_is_left_alone(tmp_path):
    search_path = ConfigSearchPathImpl()
    search_path.append("main", str(tmp_path))
    CachedConfSearchPath().manipulate_search_path(search_path)
    assert [e.path for e in search_path.get_path()] == [str(tmp_path)]
    assert Path(CONF_DIR) == Path(__file__).resolve().parent.parent / "conf"
