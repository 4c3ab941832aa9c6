"""Plugin options checked against the plugin's own signature and types, before anything starts.

A yaml in conf/strategy/, conf/model/, conf/optim/ names its class (or factory) with `_target_`; its other
keys are that callable's keyword arguments. Binding them to the signature refuses an unknown key (naming
the closest known one), a value of the wrong type and a missing required argument, in one line. Records of
the harness's own sections (dataclasses) are checked against their field types the same way.
"""

from __future__ import annotations

import dataclasses
import inspect
import pydoc
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union, get_args, get_origin

from harness.core.errors import ConfigError, unknown_key

HYDRA_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")
SIGNATURE_GROUP = "signature"  # conf/<group>/<option>.yaml's `- /signature/<dotted target>@_here_`


def signature_defaults(target: str) -> dict[str, Any]:
    """`_target_` and every keyword argument of the callable it names with its default, as the config node of
    that plugin (served to Hydra by hydra_plugins/harness_signature_source.py): each plugin option's default is
    written once, in its own signature, and conf/<group>/<option>.yaml sets only what the harness chooses
    otherwise. Arguments without a default (the harness's own: a model's num_classes, an optimizer's
    parameters) and defaults YAML cannot spell are left out."""
    obj = pydoc.locate(target)  # hydra.utils.get_object would log a many-line error of its own
    if not callable(obj):
        raise ImportError(f"no class or function {target} (an importable dotted path is needed)")
    parameters, _ = _signature(obj)
    node: dict[str, Any] = {"_target_": target}
    for name, parameter in parameters.items():
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) \
                or parameter.default is inspect.Parameter.empty or not _spelled_in_yaml(parameter.default):
            continue
        default = parameter.default
        node[name] = list(default) if isinstance(default, tuple) else default
    return node


def _spelled_in_yaml(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    return isinstance(value, list | tuple) and all(_spelled_in_yaml(v) for v in value)


def option_choices(target: str, name: str) -> tuple[str, ...] | None:
    """The values the keyword argument `name` of the callable `target` names takes, as a command line spells
    them: its Literal's (a `bool | Literal[...]` takes its named values, true and false being their aliases), or
    false and true for a bool; None for any other type, or none known. A search's axis over a model option takes
    its values from here (model.checkpoint: what the model's own signature allows, written once there)."""
    obj = pydoc.locate(target)
    if not callable(obj):
        return None
    hint = _signature(obj)[1].get(name)
    parts = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    named = [value for part in parts if get_origin(part) is Literal for value in get_args(part)]
    if named:
        return tuple(dict.fromkeys(str(v).lower() if isinstance(v, bool) else str(v) for v in named))
    return ("false", "true") if bool in parts else None


def option_target(option: Mapping[str, Any]) -> str | None:
    """The plugin a conf/<group>/<option>.yaml names: its `_target_`, or the one its defaults list takes the
    signature of."""
    if isinstance(option.get("_target_"), str):
        return str(option["_target_"])
    for entry in option.get("defaults") or []:
        name = str(entry).partition("@")[0].lstrip("/")
        if name.startswith(f"{SIGNATURE_GROUP}/"):
            return name.partition("/")[2]
    return None


def check_plugin(prefix: str, section: Mapping[str, Any], provided: tuple[str, ...] = ()) -> Callable[..., Any]:
    """The callable `section['_target_']` names, once every other key binds to its signature with the
    right type. `provided`: arguments the harness passes itself (e.g. a model's num_classes)."""
    target = section.get("_target_")
    if not isinstance(target, str):
        raise ConfigError(f"{prefix}._target_", target, "a dotted path to a class or function")
    try:
        obj = pydoc.locate(target)  # hydra.utils.get_object would log a many-line error of its own
    except Exception as error:  # noqa: BLE001 (the module itself fails to import: say how, in one line)
        raise ConfigError(f"{prefix}._target_", target, "an importable class or function (importing it raised "
                          f"{' '.join(str(error).split())})") from error
    if obj is None or not callable(obj):
        raise ConfigError(f"{prefix}._target_", target, "an importable class or function" + (
            " (no module or attribute of that name)" if obj is None else f" (it is a {type(obj).__name__})"))
    parameters, hints = _signature(obj)
    if section.get("_partial_"):  # the first argument comes at the call (an optimizer's params)
        provided = (*provided, next(iter(parameters), ""))
    accepts_anything = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    named = {n: p for n, p in parameters.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    for key, value in section.items():
        if key in HYDRA_KEYS:
            continue
        if key not in named:
            if accepts_anything:
                continue
            raise ConfigError(f"{prefix}.{key}", value, unknown_key(f"{prefix}.{key}", set(named) - set(provided)))
        check_type(f"{prefix}.{key}", value, hints.get(key))
    missing = [n for n, p in named.items() if p.default is inspect.Parameter.empty and n not in section
               and n not in provided]
    if missing:
        raise ConfigError(f"{prefix}.{missing[0]}", None, f"a value: {target} needs it")
    return obj


def check_record(prefix: str, section: Mapping[str, Any], record: type) -> dict[str, Any]:
    """The keys of `section` as a dataclass `record` takes them: unknown keys and wrong types refused."""
    fields = {f.name: f for f in dataclasses.fields(record)}
    hints = typing.get_type_hints(record)
    for key, value in section.items():
        if key not in fields:
            raise ConfigError(f"{prefix}.{key}", value, unknown_key(f"{prefix}.{key}", fields))
        check_type(f"{prefix}.{key}", value, hints.get(key))
    return dict(section)


def _signature(obj: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], dict[str, Any]]:
    function = obj.__init__ if inspect.isclass(obj) else obj
    try:
        parameters = dict(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return {}, {}
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 (unresolvable annotations: check names, not types)
        hints = {}
    return parameters, hints


def check_type(key: str, value: Any, hint: Any) -> None:
    """Refuse `value` unless it is what `hint` allows (as YAML/the command line can spell it)."""
    if hint is None or _matches(value, hint):
        return
    raise ConfigError(key, value, describe(hint))


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any or hint is inspect.Parameter.empty:
        return True
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_matches(value, arg) for arg in get_args(hint))
    if origin is Literal:
        return value in get_args(hint)
    if origin in (list, tuple, typing.Sequence, typing.MutableSequence) or hint in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        args = [a for a in get_args(hint) if a is not Ellipsis]
        return not args or all(_matches(v, args[0] if len(args) == 1 else args[min(i, len(args) - 1)])
                               for i, v in enumerate(value))
    if origin is not None and origin in (dict, Mapping, typing.Mapping):
        return isinstance(value, Mapping)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if isinstance(hint, type):
        return isinstance(value, hint)  # tensors, devices...: nothing YAML can spell
    return True


def _is_plain(hint: type) -> bool:
    return hint in (bool, int, float, str, list, tuple, dict, type(None))


def describe(hint: Any) -> str:
    """What a type hint allows, in words."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        parts = [describe(a) for a in get_args(hint) if _is_plain(a) or get_origin(a) is not None]
        return " or ".join(dict.fromkeys(parts)) or str(hint)
    if origin is Literal:
        return "one of " + ", ".join(map(str, get_args(hint)))
    if origin in (list, tuple) or hint in (list, tuple):
        return "a list"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            type(None): "null"}.get(hint, getattr(hint, "__name__", str(hint)))
