"""How a default is written once: in the record's field, with the `${...}` Hydra resolves beside it where the
default depends on the machine or the environment. `hydra_defaults` turns a record into the node Hydra composes
(harness.compose registers them in Hydra's ConfigStore), so no YAML repeats a default."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import field, fields
from typing import Any


def on_hardware(gpu: object, cpu: object, hydra: str | None = None) -> Any:
    """A default that depends on the machine: `cpu` for Python callers and on a CPU-only machine, `gpu` where
    Hydra composes on GPUs (or plans for a GPU preset): `${hw:GPU,CPU}` (harness.compose.register_resolvers)."""
    return field(default=cpu, metadata={"hydra": hydra or f"${{hw:{_text(gpu)},{_text(cpu)}}}", "gpu": gpu})


def gpu_defaults(record: type) -> dict[str, Any]:
    """The fields of a config dataclass whose default differs on GPUs, with their GPU values."""
    return {f.name: f.metadata["gpu"] for f in fields(record) if "gpu" in f.metadata}


def from_env(variable: str, default: object) -> Any:
    """A default a whole session may change through an environment variable (Hydra's `oc.env`)."""
    lookup = f"${{oc.env:{variable},{_text(default)}}}"
    return field(default=default, metadata={"hydra": f"${{oc.decode:{lookup}}}" if isinstance(default, bool)
                                            else lookup})


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def hydra_defaults(record: type, skip: Sequence[str] = ()) -> dict[str, Any]:
    """A record's defaults as Hydra composes them: each field's default, its `${...}` where it has one, nested
    records as sections; fields without a default (the choices of conf/<group>/) and `skip` are left out."""
    node: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        if f.name in skip:
            continue
        if "hydra" in f.metadata:
            node[f.name] = f.metadata["hydra"]
        elif f.default is not dataclasses.MISSING:
            node[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            made = f.default_factory()
            node[f.name] = hydra_defaults(type(made)) if dataclasses.is_dataclass(made) else made
    return node
