"""How a config key is written once: its field says its default, its help and what it allows. `option()` is the
field: the default (with the `${...}` Hydra resolves beside it where the default depends on the machine or the
environment), a line of help (docs/config.md's table is generated from it, harness.core.config_docs), the range
or check that harness.core.options' `read_record` applies. `hydra_defaults` turns a record into the node Hydra
composes (harness.compose registers them in Hydra's ConfigStore), so no YAML repeats a default; a `Literal`
field there is an Enum-typed node, so that composing a bad choice already fails."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, field, fields
from typing import Any

from harness.core.options import config_key, literal_node

Check = Callable[[str, Any], Any]  # (key, value): raises ConfigError where the value breaks the field's own rule


def option(default: Any = MISSING, help: str = "", *, gpu: Any = MISSING, env: str | None = None,
           hydra: str | None = None, ge: float | None = None, gt: float | None = None, le: float | None = None,
           lt: float | None = None, allowed: str | None = None, check: Check | None = None,
           key: str | None = None, switch: bool = False, derived: bool = False) -> Any:
    """A config field. `default`: for Python callers and on a CPU-only machine; `gpu`: where Hydra composes on
    GPUs (`${hw:GPU,CPU}`); `env`: a variable a whole session may set it by (`${oc.env:...}`); `hydra`: the
    `${...}` itself, where neither says it. `ge`/`gt`/`le`/`lt`: its range; `allowed`: what a refusal says is
    allowed (else its type and range in words); `check`: a rule of its own, after the type and range; `key`: its
    spelling in the config where that is no Python name (`_target_`); `switch`: a section that `true`/`false` may
    stand for (its `enabled`); `derived`: not a config key (the record's builder passes it)."""
    if gpu is not MISSING:
        hydra = hydra or f"${{hw:{_text(gpu)},{_text(default)}}}"
    elif env is not None:
        lookup = f"${{oc.env:{env},{_text(default)}}}"
        hydra = f"${{oc.decode:{lookup}}}" if isinstance(default, bool | int | float) else lookup  # a number, not text
    metadata = {name: value for name, value in dict(
        help=help, gpu=gpu, env=env, hydra=hydra, ge=ge, gt=gt, le=le, lt=lt, allowed=allowed, check=check,
        key=key, switch=switch or None, derived=derived or None).items() if value is not None and value is not MISSING}
    if isinstance(default, list | dict):
        made = default.copy()
        return field(default_factory=lambda: made.copy(), metadata=metadata)
    if dataclasses.is_dataclass(default):  # a section: its record (its defaults) or an instance of it
        return field(default_factory=default if isinstance(default, type) else lambda: default, metadata=metadata)
    return field(default=default, metadata=metadata)


def on_hardware(gpu: object, cpu: object, hydra: str | None = None, **rest: Any) -> Any:
    """A default that depends on the machine: `cpu` for Python callers and on a CPU-only machine, `gpu` where
    Hydra composes on GPUs (or plans for a GPU preset): `${hw:GPU,CPU}` (harness.compose.register_resolvers)."""
    return option(cpu, gpu=gpu, hydra=hydra, **rest)


def gpu_defaults(record: type) -> dict[str, Any]:
    """The fields of a config dataclass whose default differs on GPUs, with their GPU values."""
    return {f.name: f.metadata["gpu"] for f in fields(record) if "gpu" in f.metadata}


def from_env(variable: str, default: object, **rest: Any) -> Any:
    """A default a whole session may change through an environment variable (Hydra's `oc.env`)."""
    return option(default, env=variable, **rest)


def _text(value: object) -> str:
    if isinstance(value, list | tuple):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def default_of(f: dataclasses.Field[Any]) -> Any:
    """A field's Python default (MISSING: none, a group's choice)."""
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else MISSING


def hydra_defaults(record: Any, skip: Sequence[str] = (), prefix: str = "", typed: bool = True) -> dict[str, Any]:
    """A record's defaults as Hydra composes them: each field's default, its `${...}` where it has one, nested
    records as sections (an instance as default: its own values), a `Literal` field as an Enum-typed node (unless
    not `typed`: an entry point that composes inside `@hydra.main`, where Hydra would print its own many-line
    error); fields without a default (the choices of conf/<group>/), derived ones and `skip` are left out."""
    given = record if not isinstance(record, type) else None
    hints = typing.get_type_hints(type(given) if given is not None else record)
    node: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        default = default_of(f)
        if f.name in skip or f.metadata.get("derived") or default is MISSING:
            continue
        key, value = config_key(f), getattr(given, f.name) if given is not None else default
        if dataclasses.is_dataclass(value):
            node[key] = hydra_defaults(value, prefix=f"{prefix}{key}.", typed=typed)
            continue
        if "hydra" in f.metadata and value == default:
            value = f.metadata["hydra"]
        node[key] = literal_node(f"{prefix}{key}", hints[f.name], value) if typed else value
    return node
