"""Before a search's first run, in the launching process: its space composed, every candidate planned and
predicted (harness.cli.check_runs, as for any sweep), and the predictions' verdict on each: pruned with its
reason, or raced. The rounds sweeper then races `current().kept` in place of Hydra's grid."""

from __future__ import annotations

import functools
import logging
import pydoc
import time
from collections.abc import Callable, Sequence

from harness.compose import SWEEP_GROUP, Composed, compose_one
from harness.core.checkpointing import OPTION, taken_by_harness
from harness.core.config import SearchConfig
from harness.core.errors import ConfigError
from harness.core.options import option_choices
from harness.launch import checked
from harness.search.prune import prune
from harness.search.record import PrunedEntry, SearchRecord
from harness.search.space import Axis, check_axes, combinations, key_of, swept
from harness.verdict.rounds import combination_names

log = logging.getLogger(__name__)
SEARCH_KEY = "search"
GROUPS = ("strategy", "model", "data", "optim", "amp", "launcher", "experiment")  # what decides a config's keys

_CURRENT: SearchRecord | None = None


def requested(overrides: Sequence[str]) -> bool:
    """The command line asks for a search (`search=true` reaches here as `search.enabled=true`)."""
    return any(key_of(o) == f"{SEARCH_KEY}.enabled" and o.partition("=")[2].lower() == "true" for o in overrides)


def space(overrides: Sequence[str], search: SearchConfig, axes: Sequence[Axis] | None = None,
          values_on: Callable[[Composed, Axis], Sequence[str] | None] | None = None) -> list[list[str]]:
    """Every candidate: the command line's overrides (`search.*` and the grid's `sweep=` kept on each, Hydra's
    grid replaced by `sweep=none`) crossed with the search's axes where they apply. Hydra's own overrides
    (`hydra.*`, `hydra/launcher=...`) set up the sweep, not a candidate, as Hydra hands its sweeper the rest.
    `axes`: in place of `search.axes`' (a search on a preset); `values_on(config, axis)`: an axis's values where
    the combination's groups so far (strategy, model, amp...) and the strategy options it has chosen so far
    (`strategy.tp=2`: a tensor-parallel group's share of the batch) compose `config` (else option_values); None:
    the axis does not apply there."""
    typed = [o for o in overrides if key_of(o) != SWEEP_GROUP and not key_of(o).startswith((f"{SEARCH_KEY}.", "hydra"))]
    shared = [o for o in overrides if key_of(o).startswith(f"{SEARCH_KEY}.")] + [f"{SWEEP_GROUP}=none"]

    @functools.cache
    def composed(groups: tuple[str, ...]) -> Composed:
        return compose_one([*typed_plain, *groups, *shared])

    @functools.cache
    def keys_of(groups: tuple[str, ...]) -> frozenset[str]:
        return frozenset(_dotted(composed(groups).config))

    typed_plain = [o for o in typed if swept(o) is None and key_of(o) not in GROUPS]

    def groups_of(stem: list[str]) -> tuple[str, ...]:
        return tuple(o for o in stem if key_of(o) in GROUPS)

    def has_key(stem: list[str], key: str) -> bool:
        return key in keys_of(groups_of(stem))

    def values(stem: list[str], axis: Axis) -> Sequence[str] | None:
        if values_on is None:
            return option_values(composed(groups_of(stem)), axis) if axis.key.startswith("model.") else axis.values
        return values_on(composed((*groups_of(stem), *(o for o in stem if key_of(o).startswith("strategy.")))), axis)

    found = combinations(typed, check_axes(search.axes) if axes is None else axes, has_key, values)
    return [[*combination, *shared] for combination in found]


def option_values(config: Composed, axis: Axis) -> Sequence[str]:
    """An axis over a model's option takes the values the model's signature allows (model.checkpoint: none, full,
    selective where the model names them, false and true where it takes a bool): written once, in the model's
    own code. Any other axis, or an option whose type names no values, takes the axis's own. A model of one's own
    is given model.checkpoint by the harness, which recomputes the blocks it names: `false` alone where its
    `_target_` declares no block_names()."""
    if axis.key.startswith("model."):
        section = config.config.get("model") or {}
        target = section.get("_target_")
        if axis.key == f"model.{OPTION}" and target and taken_by_harness(section) and \
                not callable(getattr(pydoc.locate(str(target)), "block_names", None)):
            return ("false",)
        found = option_choices(str(target), axis.key.partition(".")[2]) if target else None
        if found:
            return found
    return axis.values


def _dotted(node: object, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return []
    keys = []
    for key, value in node.items():
        keys.append(f"{prefix}{key}")
        keys += _dotted(value, f"{prefix}{key}.")
    return keys


def settle(candidates: Sequence[list[str]], search: SearchConfig, command: str) -> SearchRecord:
    """After check_runs has planned and predicted every candidate: prune by the predictions and keep the
    record the sweeper races from. A space in which nothing can run, or nothing is predicted to fit, is bad
    input (ConfigError): nothing to search."""
    global _CURRENT
    named = combination_names(candidates, lambda i: " ".join(
        o.partition("=")[2] for o in candidates[i] if key_of(o) in ("strategy", "amp")))
    names: dict[tuple[str, ...], str] = {}
    predictions = {}
    for candidate, name in zip(candidates, named, strict=True):
        key = tuple(candidate)
        found = checked.lookup(candidate)
        if found is None or found.plan is None or not found.plan.will_run:
            continue  # refused or skipped here: the sweep's own rows say why
        names[key] = name
        predictions[key] = found.plan.prediction
    if not predictions:
        raise ConfigError("search", "true", "a space with a combination that can run here (every one of the "
                          f"{len(candidates)} was refused or skipped)")
    kept, pruned = prune(predictions, search.prune_factor, names)
    if not kept:
        raise ConfigError("search", "true", f"a space with a combination predicted to fit: all {len(candidates)} "
                          f"were predicted not to (e.g. {pruned[0].reason.removeprefix('predicted not to fit: ')})")
    record = SearchRecord(
        space=len(candidates), kept=[list(k) for k in kept], kept_names=[names[k] for k in kept],  # type: ignore[index]
        pruned=[PrunedEntry(names[p.key], list(p.key), p.reason,  # type: ignore[index, arg-type]
                            _s(predictions[p.key])) for p in pruned],  # type: ignore[index]
        predicted_s_per_iteration={names[k]: s for k, p in predictions.items() if (s := _s(p)) is not None},
        axes=list(search.axes), prune_factor=search.prune_factor, budget_s=search.budget_s, command=command,
        started_at=time.time())
    log.info("search: %d combinations in the space, %d pruned by prediction, %d to race", len(candidates),
             len(pruned), len(kept))
    for entry in record.pruned:
        log.info("  pruned %s: %s", entry.name, entry.reason)
    _CURRENT = record
    return record


def _s(prediction: object) -> float | None:
    return getattr(prediction, "s_per_iteration", None)


def current() -> SearchRecord | None:
    """The search this process checked (the rounds sweeper races its candidates), or None."""
    return _CURRENT


def forget() -> None:
    global _CURRENT
    _CURRENT = None
