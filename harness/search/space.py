"""The space a search covers (issue 40; docs/search.md): named axes, each a config key and its values, that
apply only where the composed config has that key (a DDP bucket size means nothing to FSDP2; activation
checkpointing only to a model that has it). What the user types fixes a key (`amp=O1`) or makes it an axis of its
own (`model.seq_len=64,128`), as in any sweep."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from harness.core.config import check_search_axes

if TYPE_CHECKING:
    from strategies.spec import StrategySpec


@dataclass(frozen=True)
class Axis:
    """`key` takes each of `values`; `always`: the key is in every config (else only where composition has it)."""

    key: str
    values: tuple[str, ...]
    always: bool = False


def searchable_strategies(classes: Mapping[str, type[StrategySpec]] | None = None) -> tuple[str, ...]:
    """The strategy axis's values: the conf/strategy/ choices whose class says `searchable`, from the baseline to
    the most sharded (one process first, then by how many of parameters, gradients and optimizer state a rank
    shards, then by name: single, ddp, zero, fsdp), so that a strategy added searchable joins the space with
    nothing here changed, and the space's order stays put."""
    if classes is None:
        from strategies.compat import strategy_classes

        classes = strategy_classes()
    chosen = sorted((cls.one_process_per_device, sum(cls.shards), name) for name, cls in classes.items()
                    if cls.searchable)
    return tuple(name for _, _, name in chosen)


@cache
def all_axes() -> dict[str, Axis]:
    """Every axis by its name in `search.axes`. What matters first for the speed of data-parallel training, in
    the order a reader meets it. The micro-batch axis is gradient accumulation: the global batch the user asked
    for stays, each step's micro-batch halves. `single` (one process, one device) is in the space: it is the
    baseline a user would otherwise run, and on a CPU (or for a model too small to gain from more devices) it
    can be the fastest. Built at first use: the strategies are read from conf/strategy/ and their modules
    imported, which a run that searches nothing does not pay for."""
    return {
        "strategy": Axis("strategy", searchable_strategies(), always=True),
        "amp": Axis("amp", ("O0", "O1"), always=True),
        "micro_batch": Axis("grad_accum", ("1", "2", "4"), always=True),
        "bucket": Axis("strategy.bucket_cap_mb", ("25", "100")),
        "comm_hook": Axis("strategy.comm_hook", ("none", "bf16")),
        "compile": Axis("compile", ("false", "true"), always=True),
        "checkpoint": Axis("model.checkpoint", ("false", "true")),
    }


def key_of(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def swept(override: str) -> list[str] | None:
    """The values a typed `key=a,b` sweeps; None for one value (a list value `key=[a,b]` is one value)."""
    value = override.partition("=")[2]
    if "," not in value or value.lstrip().startswith(("[", "{")):
        return None
    return value.split(",")


def check_axes(names: Sequence[str]) -> list[Axis]:
    """`search.axes` as given, checked by the config's own rule (harness.core.config), as their Axis records."""
    check_search_axes(names)
    known = all_axes()
    return [known[n] for n in names]


def combinations(typed: Sequence[str], axes: Sequence[Axis], has_key: Callable[[list[str], str], bool],
                 values_of: Callable[[list[str], Axis], Sequence[str] | None] | None = None) -> list[list[str]]:
    """Every combination of the space: the typed overrides (a comma list is an axis of its own, a single value
    fixes its key) crossed with each axis the user did not type, where it applies. `has_key(overrides, key)`:
    whether the config those overrides compose has `key` (an axis that does not apply is left out of that
    combination, not crossed with it). `values_of(overrides, axis)`: the axis's values where those overrides are
    already chosen (a search on a preset: the micro-batches each strategy's ranks can take), or None where the axis
    does not apply to them though their config has its key (a pipeline's microbatches, for FSDP without a
    pipeline); else `axis.values`."""
    fixed = {key_of(o) for o in typed}
    own = [[o] if (values := swept(o)) is None else [f"{o.partition('=')[0]}={v}" for v in values] for o in typed]
    searched = [a for a in axes if a.key not in fixed]
    found: list[list[str]] = []
    for base in itertools.product(*own):
        stems = [list(base)]
        for axis in searched:  # in all_axes()' order: the strategy is chosen before the axes that depend on it
            grown: list[list[str]] = []
            for stem in stems:
                values = (values_of(stem, axis) if values_of else axis.values) \
                    if axis.always or has_key(stem, axis.key) else None
                if values is None:
                    grown.append(stem)
                else:
                    grown += [[*stem, f"{axis.key}={value}"] for value in values]
            stems = grown
        found += stems
    return _unique(found)


def _unique(found: list[list[str]]) -> list[list[str]]:
    seen: set[tuple[str, ...]] = set()
    out = []
    for combination in found:
        if tuple(combination) not in seen:
            seen.add(tuple(combination))
            out.append(combination)
    return out
