"""Plugin options checked against the plugin's own signature and types, before anything starts.

A yaml in conf/strategy/, conf/model/, conf/optim/ names its class (or factory) with `_target_`; its other
keys are that callable's keyword arguments. Binding them to the signature refuses an unknown key (naming
the closest known one), a value of the wrong type and a missing required argument, in one line. Records of
the harness's own sections (dataclasses) are read by their fields the same way (`read_record`): each field's type,
range and rule, written once in the field (harness.core.defaults' `option`).
"""

from __future__ import annotations

import copyreg
import dataclasses
import enum
import functools
import inspect
import math
import operator
import pydoc
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from omegaconf.errors import ValidationError
from omegaconf.nodes import EnumNode

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


T = TypeVar("T")


def config_key(f: dataclasses.Field[Any]) -> str:
    """A field's spelling in the config (`_target_` for a field named `target`)."""
    return str(f.metadata.get("key", f.name))


@functools.cache
def _hints(record: type) -> dict[str, Any]:
    return typing.get_type_hints(record)


def read_record(prefix: str, section: Mapping[str, Any], record: type[T], **given: Any) -> T:
    """`section` as the dataclass `record`, read by its fields (harness.core.defaults' `option`): a key that is no
    field refused (naming the closest), each value checked by its field's type, then its range, then its own rule;
    a nested record read as a section; an absent key left to the field's default. `given`: the derived fields."""
    fields = {config_key(f): f for f in dataclasses.fields(record)  # type: ignore[arg-type]
              if not f.metadata.get("derived")}
    unknown = sorted(set(section) - set(fields))
    if unknown:
        key = _join(prefix, unknown[0])
        raise ConfigError(key, section[unknown[0]], unknown_key(key, fields))
    values = dict(given)
    for name, f in fields.items():
        key, hint = _join(prefix, name), _hints(record)[f.name]
        if name in section:
            values[f.name] = read_value(key, section[name], hint, f)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(key, None, allowed_text(key, hint, f))
    return record(**values)


def read_value(key: str, value: Any, hint: Any, f: dataclasses.Field[Any]) -> Any:
    """One value as its field keeps it, or ConfigError naming the key, the value and what is allowed."""
    if isinstance(value, enum.Enum):  # a Literal field as Hydra composes it (Choice): its plain string
        value = value.value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if value is None:
            return hint()
        if f.metadata.get("switch") and isinstance(value, bool):  # `parity=true`: parity.enabled=true
            return hint(enabled=value)
        if not isinstance(value, Mapping):
            raise ConfigError(key, value, allowed_text(key, hint, f))
        return read_record(key, value, hint)
    if not _matches(value, hint) or (value is not None and not _in_range(value, f.metadata)):
        raise ConfigError(key, value, allowed_text(key, hint, f))
    if "check" in f.metadata:
        f.metadata["check"](key, value)
    if get_origin(hint) is Mapping:  # a plugin's section: the record's own copy
        return dict(value)
    tuples = get_origin(hint) is tuple or tuple in (get_origin(a) for a in get_args(hint))
    return tuple(value) if tuples and isinstance(value, list) else value


RANGE = (("ge", ">=", operator.ge), ("gt", ">", operator.gt), ("le", "<=", operator.le), ("lt", "<", operator.lt))


def _in_range(value: Any, metadata: Mapping[str, Any]) -> bool:
    return all(test(value, metadata[name]) for name, _, test in RANGE if name in metadata)  # NaN: never


def allowed_text(key: str, hint: Any, f: dataclasses.Field[Any]) -> str:
    """What a field allows, in words: its `allowed`, else its type and range (`an integer >= 1`), a section's
    keys."""
    if "allowed" in f.metadata:
        return str(f.metadata["allowed"])
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        keys = ", ".join(f"{key}.{config_key(g)}" for g in dataclasses.fields(hint))
        return f"true, false, or the section ({keys})" if f.metadata.get("switch") else f"the section ({keys})"
    bounds = " and ".join(f"{sign} {f.metadata[name]:g}" for name, sign, _ in RANGE
                          if name in f.metadata and math.isfinite(f.metadata[name]))
    if not bounds:
        return describe(hint)
    parts = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    text = f"{describe(Union[tuple(p for p in parts if p is not type(None))])} {bounds}"  # noqa: UP007
    return f"{text} or null" if type(None) in parts else text


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


class _ChoiceType(enum.EnumMeta):
    """A name that is no member refused as the harness refuses it: one line naming the key. OmegaConf keeps this
    error as the cause of its own, where harness.compose.as_config_error finds it."""

    def __getitem__(cls, name: str) -> Any:
        try:
            return super().__getitem__(name)
        except KeyError:
            raise ConfigError(cls._key, name, cls._allowed) from None  # type: ignore[attr-defined]


class Choice(str, enum.Enum, metaclass=_ChoiceType):
    """A `Literal` field's values as OmegaConf 2.3 takes a closed set, an Enum (it reads no Literal), so that
    composing a bad choice already fails. A member is its value as a string (compares, hashes, prints and goes
    to JSON as one); read_value keeps the plain string."""

    __str__ = str.__str__
    __format__ = str.__format__

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def _missing_(cls, value: object) -> Any:  # an integer, as OmegaConf passes one: refused alike
        raise ConfigError(cls._key, value, cls._allowed)  # type: ignore[attr-defined]


@functools.cache
def choice_enum(key: str, values: tuple[str, ...], allowed: str) -> type[Choice]:
    """The Enum of one key's choices; the same class for the same key (a pickled config finds it again)."""
    made = Choice(key, [(v, v) for v in values], module=__name__)  # type: ignore[call-overload]
    made._key, made._allowed = key, allowed
    return made  # type: ignore[no-any-return]


def _reduce_choice(cls: type) -> Any:
    key = getattr(cls, "_key", None)
    return cls.__qualname__ if key is None else (choice_enum, (key, tuple(cls.__members__), cls._allowed))


copyreg.pickle(_ChoiceType, _reduce_choice)


def literal_values(hint: Any) -> tuple[tuple[str, ...], bool]:
    """A `Literal[...]` (or `Literal[...] | None`) hint's values and whether null is allowed; () for other hints."""
    parts = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    values = tuple(v for p in parts if get_origin(p) is Literal for v in get_args(p))
    if not values or not all(isinstance(v, str) for v in values) or \
            any(p is not type(None) and get_origin(p) is not Literal for p in parts):
        return (), False
    return values, type(None) in parts


class ChoiceNode(EnumNode):  # type: ignore[misc]
    """The node of a `Literal` field: an EnumNode that refuses a number or a boolean in the harness's words too
    (EnumNode's own message would be OmegaConf's, with no key)."""

    def validate_and_convert(self, value: Any) -> Any:
        if value is not None and (isinstance(value, bool | float) or not isinstance(value, str | int | enum.Enum)):
            cause = ConfigError(self.enum_type._key, value, self.enum_type._allowed)
            raise ValidationError(str(cause)) from cause
        return super().validate_and_convert(value)

    def __deepcopy__(self, memo: dict[int, Any]) -> ChoiceNode:  # EnumNode's would copy into an EnumNode
        copy = ChoiceNode(enum_type=self.enum_type)
        self._deepcopy_impl(copy, memo)
        return copy


def literal_node(key: str, hint: Any, value: Any) -> Any:
    """`value` as Hydra composes the field `key` of type `hint`: an Enum-typed node for a Literal (OmegaConf refuses
    another value while composing, in the harness's words), the value itself otherwise."""
    values, optional = literal_values(hint)
    if not values:
        return value
    return ChoiceNode(enum_type=choice_enum(key, values, describe(hint)), value=value, is_optional=optional)


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
