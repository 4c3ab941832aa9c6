"""`harness-conf://`: the harness's conf/ folder, each YAML file parsed once per process.

Hydra parses every file of a config again at each composition. `run.py` composes each combination before
anything starts (harness.cli.precheck), and Hydra composes it again for its job; a sweep or a search does this
for every combination, and the test suite composes thousands of times: about 0.2 s each, 40 % of it parsing the
same files. This source is Hydra's own file source with the parse kept per file (path and modification time):
each load returns a deep copy, as Hydra edits what it loads (it strips the defaults lists).

It applies only to the search path whose primary folder is this repository's conf/ (`run.py`, the compose API
of harness.compose): the search-path plugin swaps that one element's scheme and leaves any other Hydra app's
search path as it is. Hydra takes config sources and search-path plugins only from the `hydra_plugins` package.
"""

# No `from __future__ import annotations`: Hydra loads this module outside sys.modules (see the sweeper's).
import copy
import dataclasses
import os
from typing import Dict, Tuple  # noqa: UP035 (real types, as in the other plugins here)

from hydra._internal.core_plugins.file_config_source import FileConfigSource
from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.config_source import ConfigResult
from hydra.plugins.search_path_plugin import SearchPathPlugin

SCHEME = "harness-conf"
CONF_DIR = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "conf"))

_PARSED: Dict[Tuple[str, int], ConfigResult] = {}  # noqa: UP006 (real path, st_mtime_ns) -> the first parse


class CachedConfSource(FileConfigSource):
    @staticmethod
    def scheme() -> str:
        return SCHEME

    def load_config(self, config_path: str) -> ConfigResult:
        full_path = os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path)))
        try:
            key = (full_path, os.stat(full_path).st_mtime_ns)
        except OSError:
            return super().load_config(config_path)  # Hydra's own error for a missing file
        if key not in _PARSED:
            _PARSED[key] = super().load_config(config_path)
        parsed = _PARSED[key]
        return dataclasses.replace(parsed, config=copy.deepcopy(parsed.config), header=dict(parsed.header))


class CachedConfSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for element in search_path.get_path():
            path = element.path.removeprefix("file://")
            if "://" not in path and os.path.realpath(path) == CONF_DIR:
                element.path = f"{SCHEME}://{CONF_DIR}"

