"""The config as Hydra composes it, outside `@hydra.main`: the resolvers `conf/` uses, the combinations a
command line describes (a sweep's cartesian product, as Hydra's basic sweeper makes it), each composed
and checked before Hydra starts, and Hydra's errors turned into one line naming the key."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from harness.core.config import CONF_DIR, RunConfig
from harness.core.errors import ConfigError, unknown_key

SWEEP_GROUP = "sweep"
NO_GRID = "none"  # conf/sweep/none.yaml: sweep only the axes typed


@functools.cache
def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def sized_for_gpus(root: Any) -> bool:
    """Whether `${hw:...}` takes its GPU value: this machine has GPUs, or `plan=true` predicts for a GPU preset
    (so `plan=true plan.hardware=h100x8` plans the user's GPU experiment, not the CPU-sized one)."""
    plan = OmegaConf.select(root, "plan", default=None) if root is not None else None
    if plan is not None and OmegaConf.select(plan, "enabled", default=False) is True:
        hardware = OmegaConf.select(plan, "hardware", default="local")
        if hardware != "local":
            from harness.prediction.hardware import preset_accelerator

            accelerator = preset_accelerator(str(hardware))
            if accelerator is not None:
                return accelerator == "cuda"
    return has_gpu()


def register_resolvers() -> None:
    """`${hw:GPU_VALUE,CPU_VALUE}`: the user's experiment on GPUs (or planned for a GPU preset), a CPU-sized
    workload otherwise.
    `${amp_plugin:IMPL}`: the amp plugin class for `amp.impl` (amp's `_common`: its `_target_`).
    `${cpu_iterations:PROFILE}`: the CPU default of `iterations`, 40, or 60 with profile=true.
    And the defaults, written once in harness/core/config.py and amp_levels.py, as the nodes conf/ composes:
    `harness_defaults` (conf/config.yaml's first), `amp/_common` (what every amp level starts from) and
    `data/_<source>` (each data source's keys)."""
    from hydra.core.config_store import ConfigStore

    from harness.core.amp_levels import amp_defaults, plugin_path
    from harness.core.config import DATA_SOURCES, data_defaults, run_defaults

    if not OmegaConf.has_resolver("hw"):
        OmegaConf.register_new_resolver("hw", lambda gpu, cpu, *, _root_: gpu if sized_for_gpus(_root_) else cpu)
    if not OmegaConf.has_resolver("amp_plugin"):
        OmegaConf.register_new_resolver("amp_plugin", plugin_path)
    if not OmegaConf.has_resolver("cpu_iterations"):  # a profiled window needs a steady window beside it
        OmegaConf.register_new_resolver("cpu_iterations", lambda profile: 60 if profile else 40)
    store = ConfigStore.instance()
    store.store(name="harness_defaults", node=run_defaults())
    store.store(group="amp", name="_common", node=amp_defaults())
    for source in DATA_SOURCES:
        store.store(group="data", name=f"_{source}", node=data_defaults(source))


@contextmanager
def hydra_context() -> Iterator[None]:
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_resolvers()
    if GlobalHydra.instance().is_initialized():  # already inside one (tests, an outer compose)
        yield
        return
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield


@dataclass(frozen=True)
class Composed:
    """One combination: its overrides, the resolved config (no `hydra` node) and Hydra's group choices."""

    overrides: tuple[str, ...]
    config: dict[str, Any]
    choices: dict[str, str | None]

    @property
    def strategy_name(self) -> str:
        return str(self.choices.get("strategy"))

    @functools.cached_property
    def run(self) -> RunConfig:
        """The typed config, checked once."""
        return RunConfig.from_dict(self.config, self.strategy_name)


def compose_one(overrides: Sequence[str], config_name: str = "config") -> Composed:
    """Compose (inside `hydra_context()`) and resolve; raises ConfigError with one line."""
    from hydra import compose

    try:
        cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
        choices = dict(OmegaConf.to_container(cfg.hydra.runtime.choices))
        with open_dict(cfg):
            del cfg["hydra"]  # its interpolations need a running Hydra; the run's own keys do not
        config = OmegaConf.to_container(cfg, resolve=True)
    except Exception as error:  # noqa: BLE001 (Hydra/OmegaConf raise many kinds: each becomes one line)
        raise as_config_error(error, overrides) from error
    baseline = (config.get("report") or {}).get("baseline")
    if baseline is not None and str(baseline).partition(":")[0] not in _group_options("strategy"):
        raise ConfigError("report.baseline", baseline, "strategy:amp with a strategy of conf/strategy/ ("
                          + ", ".join(_group_options("strategy")) + "), e.g. single:O0")
    return Composed(tuple(overrides), config, choices)  # type: ignore[arg-type]


def combinations(overrides: Sequence[str], multirun: bool) -> list[list[str]]:
    """The runs a command line describes. A sweep is what Hydra's basic sweeper would make of it: the
    grid of conf/sweep/ (only when no axis is typed) and the typed overrides, as a cartesian product."""
    if not multirun:
        return [list(overrides)]
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(list(overrides))
        grid = composed_sweep_params(overrides)
        parsed = parser.parse_overrides([f"{k}={v}" for k, v in grid.items()] + list(overrides))
    except OverrideParseException as error:
        raise ConfigError("override", " ".join(overrides), f"Hydra override syntax ({first_line(error)})") from error
    return expand(parsed)


def expand(parsed: Sequence[Any]) -> list[list[str]]:
    """Parsed overrides (Hydra's `Override`s) as a sweep's combinations: Hydra's basic sweeper's cartesian product,
    in its order (so the job numbers are Hydra's). The one place a grid is expanded: the pre-check's, and the
    rounds sweeper's only for a sweep this process did not check (harness.launch.checked.combinations)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return [list(combo) for batch in BasicSweeper.split_arguments(list(parsed), None) for combo in batch]


def composed_sweep_params(overrides: Sequence[str]) -> dict[str, str]:
    """hydra.sweeper.params as composed for these overrides (the conf/sweep/ grid, or none)."""
    from hydra import compose

    try:
        cfg = compose(config_name="config", overrides=[o for o in overrides if _is_plain(o)],
                      return_hydra_config=True)
    except Exception as error:  # noqa: BLE001
        raise as_config_error(error, overrides) from error
    params = cfg.hydra.sweeper.get("params") or {}
    return {str(k): str(v) for k, v in params.items()}


def _is_plain(override: str) -> bool:
    """An override that names one value (sweep syntax is left to the sweeper)."""
    key, _, value = override.partition("=")
    return "," not in value and not value.strip().startswith(("range(", "choice(", "interval(", "glob("))


def typed_sweep_axes(overrides: Sequence[str]) -> list[str]:
    """The keys the user asked to sweep (comma lists or sweep functions), `hydra.*` keys left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # noqa: BLE001 (reported when the combinations are composed)
        return []
    return [o.get_key_element() for o in parsed if o.is_sweep_override() and not o.key_or_group.startswith("hydra")]


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def as_config_error(error: BaseException, overrides: Sequence[str]) -> ConfigError:
    """Hydra's and OmegaConf's many-line errors as the harness's one line (key, value, what is allowed)."""
    cause: BaseException | None = error
    while cause is not None:  # a resolver or a check of ours inside OmegaConf: keep its own words
        if isinstance(cause, ConfigError):
            return cause
        cause = cause.__cause__ or cause.__context__
    message = str(error)
    values = dict(o.lstrip("+~").partition("=")[::2] for o in overrides if "=" in o)
    match = re.search(r"Could not override '([^']+)'", message)
    if match:
        key = match.group(1)
        return ConfigError(key, values.get(key), section_unknown_key(key, overrides) or unknown_key(key, known_keys()))
    match = re.search(r"Could not append to config\. An item is already at '([^']+)'", message)
    if match:
        key = match.group(1)
        return ConfigError(f"+{key}", values.get(key), f"{key}={values.get(key)} without '+' ({key} exists)")
    match = re.search(r"full_key: ([\w.]+)", message)
    if match:
        key = match.group(1)
        return ConfigError(key, values.get(key), first_line(error))
    return ConfigError("overrides", " ".join(overrides), first_line(error))


def section_unknown_key(key: str, overrides: Sequence[str]) -> str | None:
    """What to say about `section.key` that is not in its section: the closest key of the section as this run
    composes it (`strategy=ddp`'s keys for `strategy.comm_hok`), or the other choice of the group the key
    belongs to (`data.root` is data=loader's). None when the section itself does not exist (a top-level typo)."""
    from hydra import compose

    section, _, leaf = key.rpartition(".")
    if not section:
        return None
    rest = [_first_choice(o) for o in overrides if o.lstrip("+~").partition("=")[0] != key]
    try:
        cfg = compose(config_name="config", overrides=rest, return_hydra_config=True)
    except Exception:  # noqa: BLE001 (another bad override: the top-level list is all we can say)
        return None
    node = OmegaConf.select(cfg, section)
    if not isinstance(node, DictConfig):
        return None
    keys = sorted(str(k) for k in node if k != "_target_")
    group = section.split(".")[0]
    choice = cfg.hydra.runtime.choices.get(group) if group == section else None
    where = f"{group}={choice}" if choice is not None else section
    close = difflib.get_close_matches(leaf, keys, n=1, cutoff=0.6)
    if close:
        return f"no such key in {where}; did you mean {section}.{close[0]}? the keys of {where} are {', '.join(keys)}"
    others = [o for o in _group_options(group) if o != choice] if choice is not None else []
    owners = [o for o in others if leaf in _yaml_keys(group, o)]
    if owners:
        return (f"{key} belongs to {_either(group, owners)} (this run has {where}); "
                f"the keys of {where} are {', '.join(keys)}")
    near = difflib.get_close_matches(leaf, sorted({k for o in others for k in _yaml_keys(group, o)}), n=1, cutoff=0.6)
    if near:
        owners = [o for o in others if near[0] in _yaml_keys(group, o)]
        return (f"no such key in {where}; did you mean {section}.{near[0]}? it belongs to {_either(group, owners)} "
                f"(this run has {where}); the keys of {where} are {', '.join(keys)}")
    return f"no such key in {where}; the keys of {where} are {', '.join(keys)}"


def _first_choice(override: str) -> str:
    """A sweep's `strategy=ddp,zero` as its first combination composes it (`strategy=ddp`)."""
    key, _, value = override.partition("=")
    return override if _is_plain(override) or "(" in value else f"{key}={value.split(',')[0]}"


def _either(group: str, options: Sequence[str]) -> str:
    return " or ".join(f"{group}={o}" for o in options)


def _group_options(group: str) -> list[str]:
    """A config group's choices (conf/<group>/*.yaml; files starting with `_` are shared parts)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


def _yaml_keys(group: str, option: str) -> list[str]:
    """The keys conf/<group>/<option>.yaml sets, itself or through the defaults it names: a node of the
    ConfigStore (`data/_loader`) or its plugin's signature (`/signature/strategies.ddp.TorchDDP`). Enough to say
    which choice a key belongs to."""
    from hydra.core.config_store import ConfigStore

    from harness.core.options import SIGNATURE_GROUP, signature_defaults

    loaded = OmegaConf.load(CONF_DIR / group / f"{option}.yaml")
    if not isinstance(loaded, DictConfig):
        return []
    keys = [str(k) for k in loaded if k != "defaults"]
    for entry in loaded.get("defaults") or []:
        name = str(entry).partition("@")[0]
        try:
            if name.lstrip("/").startswith(f"{SIGNATURE_GROUP}/"):
                keys += list(signature_defaults(name.lstrip("/").partition("/")[2]))
            elif name.startswith("_"):
                keys += [str(k) for k in ConfigStore.instance().load(f"{group}/{name}.yaml").node]
        except Exception:  # noqa: BLE001 (a plugin that does not import, a yaml of the group: its own keys only)
            continue
    return sorted(set(keys) - {"_target_", "_partial_"})


@functools.cache
def known_keys() -> frozenset[str]:
    """The top-level keys and config groups a user overrides (Hydra's own `hydra.*` left out)."""
    from hydra import compose

    cfg = compose(config_name="config", overrides=[], return_hydra_config=True)
    keys = {str(k) for k in cfg if k != "hydra"} | {str(g) for g in cfg.hydra.runtime.choices}
    return frozenset(k for k in keys if not k.startswith("hydra"))


def plain(config: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]
