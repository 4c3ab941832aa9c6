"""`signature://`: a plugin option's defaults read from the signature of the class or function it names.

conf/strategy/ddp.yaml starts with `- /signature/strategies.ddp.TorchDDP@_here_`: Hydra asks this source for
`signature/strategies.ddp.TorchDDP` and gets `_target_` and every keyword argument with its default
(harness.core.options.signature_defaults), so each default is written once, in the plugin's own signature, and
the yaml sets only what the harness chooses otherwise. The node is built when an option is composed, so a
run imports only the plugins it uses. Hydra takes config sources and search-path plugins only from the
`hydra_plugins` package; the harness is imported lazily."""

# No `from __future__ import annotations`: Hydra loads this module outside sys.modules (see the sweeper's).
from typing import List, Optional  # noqa: UP035 (Hydra's own signatures)

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

SCHEME = "signature"
GROUP = "signature"  # harness.core.options.SIGNATURE_GROUP


class SignatureSource(ConfigSource):
    @staticmethod
    def scheme() -> str:
        return SCHEME

    def load_config(self, config_path: str) -> ConfigResult:
        from harness.core.options import signature_defaults

        target = self._target(config_path)
        if target is None:
            raise ConfigLoadError(f"not a plugin's signature: {config_path}")
        try:
            node = signature_defaults(target)
        except Exception as error:  # noqa: BLE001 (an import error of any kind: named in one line)
            raise ConfigLoadError(f"{target}: cannot read its signature ({' '.join(str(error).split())})") from error
        return ConfigResult(config=OmegaConf.create(node), path=f"{SCHEME}://", provider=self.provider,
                            header=self._get_header_dict(""))  # no `# @package` line: the default package

    @staticmethod
    def _target(config_path: str) -> Optional[str]:  # noqa: UP045
        group, _, name = config_path.partition("/")
        name = name[:-len(".yaml")] if name.endswith(".yaml") else name
        return name if group == GROUP and "." in name and "/" not in name else None

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        return config_path == GROUP

    def is_config(self, config_path: str) -> bool:
        return self._target(config_path) is not None

    def list(self, config_path: str, results_filter: Optional[ObjectType]) -> List[str]:  # noqa: UP006, UP045
        return []  # every importable callable: not listed


class SignatureSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="parallel-harness", path=f"{SCHEME}://")
