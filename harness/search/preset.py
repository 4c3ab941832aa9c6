"""`python run.py -m search=true plan=true plan.hardware=<preset>`: a layout found without running, for a cluster
not rented yet (docs/search.md). The space is the search's (harness.search.shortlist), with the axes that matter on
a GPU preset; every candidate is predicted on the preset by the caller's `predict` (harness.launch.on_preset's
`predict_on`, as plan=true does) and nothing is trained. What would not fit there, or cannot run there, is pruned
with its reason; a micro-batch larger than one predicted not to fit is pruned without being predicted (memory only
grows with the micro-batch); a candidate that composes the config of one already predicted is not predicted again.
The answer: the fastest predicted combination with its band, the runner-up, what was pruned and why, and the command
that trains the winner on the cluster."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hydra.utils import get_class

from harness.compose import Composed, compose_one
from harness.core.config import CONF_DIR, RunConfig
from harness.core.errors import ConfigError
from harness.prediction.hardware import LOCAL, Preset, load_preset
from harness.search.answer import training_command
from harness.search.shortlist import option_values, space
from harness.search.space import Axis, all_axes, check_axes, key_of
from harness.verdict.rounds import combination_names

log = logging.getLogger(__name__)

# The axes searched on a GPU preset unless search.axes names others: what decides a large model's speed there.
# compile's fusions are not predicted (harness.prediction), and a DDP bucket size or a compression hook (bucket,
# comm_hook) moves a prediction over NVLink little: each is searched where search.axes names it.
PRESET_AXES = ("strategy", "amp", "micro_batch", "checkpoint")
# the strategies that use every GPU of a cluster, those of them conf/strategy/ has
PRESET_STRATEGIES = ("ddp", "zero", "fsdp")
# on more than one node, a strategy with this option (fsdp) is also searched as HSDP sharded within each node:
# `strategy.replicate=<nodes>` (all-gathers on the node's own links, one gradient shard all-reduced across nodes)
REPLICATE = "strategy.replicate"
PRESET_AMP = ("O0", "O1")
HALF = "bfloat16"  # O1 on a GPU preset: bfloat16 autocast (amp.dtype's auto is float16 on CUDA), unless typed

NOT_FIT = "predicted not to fit"
LARGER_MICRO = "larger micro-batch than one that does not fit"
SAME = "the same config as another candidate"
PLAN_KEYS = ("plan", "search", "sweep", "hydra")  # a search's keys, not the training run's


@dataclass(frozen=True)
class Space:
    candidates: list[list[str]]  # each candidate's overrides, the search's own keys included
    names: list[str]  # as the progress lines, plan.md and plan.json name them
    axes: list[str]  # what was searched, in words (`micro_batch (grad_accum): 1, 2, 4`)
    hardware: str
    nodes: int


def preset_space(overrides: Sequence[str], base: RunConfig) -> Space:
    """The candidates of a search on `base.plan.hardware`. On a GPU preset, unless `search.axes` is typed, the axes
    are PRESET_AXES; the strategies those of PRESET_STRATEGIES that exist, amp O0 and O1 with bfloat16 autocast, the
    micro-batch every power of two that divides a rank's share of the global batch (grad_accum 1, 2, 4, ... while
    the micro-batch is at least 1), activation checkpointing the values the model's signature allows. On more than
    one node (plan.nodes), each candidate of a strategy that takes `strategy.replicate` (fsdp) also as HSDP with one
    replica a node, unless the command line types it."""
    hardware = base.plan.hardware
    preset = load_preset(hardware) if hardware != LOCAL else None
    gpu = preset is not None and preset.accelerator == "cuda"
    typed_axes = any(key_of(o) == "search.axes" for o in overrides)
    names = list(base.search.axes) if typed_axes or not gpu else list(PRESET_AXES)
    axes = check_axes(names)
    if gpu:
        have = {p.stem for p in (CONF_DIR / "strategy").glob("*.yaml")}
        preset_values = {"strategy": tuple(s for s in PRESET_STRATEGIES if s in have), "amp": PRESET_AMP}
        axes = [replace(a, values=preset_values.get(a.key, a.values)) for a in axes]
    nodes = nodes_of(base, preset) if preset is not None else 1
    hybrid = gpu and nodes > 1 and not any(key_of(o) == REPLICATE for o in overrides)
    if hybrid:  # right after the strategy axis: 1 (plain FSDP, the option dropped below) and <nodes> (HSDP)
        at = next((i + 1 for i, a in enumerate(axes) if a.key == all_axes()["strategy"].key), 0)
        axes = [*axes[:at], Axis(REPLICATE, ("1", str(nodes))), *axes[at:]]

    def values_on(config: Composed, axis: Axis) -> Sequence[str]:
        if axis.key == all_axes()["micro_batch"].key and preset is not None:
            return micro_batches(config.run, preset, nodes)
        return option_values(config, axis)

    found = space(overrides, base.search, axes, values_on)
    if hybrid:  # plain FSDP as the command line spells it, without `strategy.replicate=1`
        found = [[o for o in c if o != f"{REPLICATE}=1"] for c in found]
    if gpu:
        found = [with_half(c) for c in found]
    hsdp = f"{REPLICATE}={nodes}"  # one value left once plain FSDP's 1 is dropped: named here, not as varying

    def describe(i: int) -> str:
        return _describe(found[i]) + (f" replicate={nodes}" if hybrid and hsdp in found[i] else "")

    named = combination_names([[o for o in c if not o.startswith("amp.dtype=")] for c in found], describe)
    said = [f"{name}{f' ({key})' if key != name else ''}: {', '.join(searched(found, key)) or 'applies to none'}"
            for name, key in ((n, all_axes()[n].key) for n in names)]
    if hybrid and searched(found, REPLICATE):
        said.append(f"HSDP ({hsdp}): sharded within each of the {nodes} nodes, beside plain FSDP")
    if gpu and "amp=O1" in {o for c in found for o in c}:
        said.append(f"O1 as {HALF} autocast (amp.dtype={HALF})")
    return Space(found, named, said, hardware, nodes)


def nodes_of(cfg: RunConfig, preset: Preset) -> int:
    """The preset's nodes (a `plan.nodes` of the config, where it has one, in their place)."""
    nodes = getattr(cfg.plan, "nodes", None)
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1 else preset.nodes


def micro_batches(cfg: RunConfig, preset: Preset, nodes: int) -> tuple[str, ...]:
    """grad_accum 1, 2, 4, ...: each a power of two that divides a rank's share of the global batch, down to
    micro-batches of one sample. A strategy with one process per device has every device of the preset's nodes;
    another one process (its batch is its own)."""
    world = preset.devices_per_node * nodes if get_class(cfg.strategy["_target_"]).one_process_per_device else 1
    per_rank = max(1, cfg.batch_size // world)
    found, accum = [], 1
    while accum <= per_rank and per_rank % accum == 0:
        found.append(str(accum))
        accum *= 2
    return tuple(found)


def with_half(candidate: list[str]) -> list[str]:
    """An O1 candidate on a GPU preset autocasts to bfloat16 (right after `amp=O1`), unless amp.dtype is typed."""
    if "amp=O1" not in candidate or any(key_of(o) == "amp.dtype" for o in candidate):
        return candidate
    at = candidate.index("amp=O1") + 1
    return [*candidate[:at], f"amp.dtype={HALF}", *candidate[at:]]


def searched(candidates: Sequence[list[str]], key: str) -> list[str]:
    """The values `key` takes across the candidates, in their order."""
    return list(dict.fromkeys(o.partition("=")[2] for c in candidates for o in c if key_of(o) == key))


def _describe(candidate: list[str]) -> str:
    """`fsdp O1 bf16`: the strategy and amp level, and the half type where one is named (O0 has none)."""
    own = dict(o.partition("=")[::2] for o in candidate)
    half = {"bfloat16": "bf16", "float16": "fp16"}.get(own.get("amp.dtype", ""), "") if own.get("amp") != "O0" else ""
    return " ".join(p for p in (own.get("strategy", ""), own.get("amp", ""), half) if p)


# ---- predicting, pruning as it goes ----

Predict = Callable[[list[str], RunConfig], dict[str, Any]]


def predict_all(found: Space, predict: Predict) -> list[dict[str, Any]]:
    """Every candidate's row (plan.json's), in the space's order. Predicted in groups of the same strategy, amp
    and checkpointing, the smallest micro-batch first, so that one predicted not to fit prunes the larger ones
    without their predictions; a candidate composing a config already predicted is not predicted again."""
    rows: list[dict[str, Any] | None] = [None] * len(found.candidates)
    order = by_micro_batch(found.candidates)
    seen: dict[str, str] = {}  # a composed config -> the candidate that predicted it
    misfit: dict[tuple[str, ...], tuple[int, str]] = {}  # a group -> its smallest micro-batch that does not fit
    took: list[float] = []
    for done, index in enumerate(order, 1):
        combo, name = found.candidates[index], found.names[index]
        group, accum = _group(combo)
        row: dict[str, Any] = {"name": name, "overrides": combo, "hardware": found.hardware}
        began = time.perf_counter()
        if group in misfit and accum < misfit[group][0]:
            row.update(status="pruned", reason=f"{LARGER_MICRO} ({misfit[group][1]})")
        else:
            row.update(_predicted(combo, name, predict, seen))
            if row["status"] == "predicted":
                took.append(time.perf_counter() - began)
                row["seconds"] = round(took[-1], 2)
                if not row["prediction"]["fits"] and accum > misfit.get(group, (0, ""))[0]:
                    misfit[group] = (accum, name)
        rows[index] = row
        left = (sum(took) / len(took) * (len(order) - done)) if took and done < len(order) else None
        timing = f" ({row['seconds']:.1f} s{f'; about {left:.0f} s left' if left is not None else ''})" \
            if "seconds" in row else ""
        log.info("search: %d/%d %s: %s%s", done, len(order), name, _said(row), timing)
    return [r for r in rows if r is not None]


def by_micro_batch(candidates: Sequence[list[str]]) -> list[int]:
    """The order of prediction: each group (everything but grad_accum) where it first appears, its largest
    grad_accum (smallest micro-batch) first."""
    first: dict[tuple[str, ...], int] = {}
    for index, combo in enumerate(candidates):
        first.setdefault(_group(combo)[0], index)
    return sorted(range(len(candidates)), key=lambda i: (first[_group(candidates[i])[0]], -_group(candidates[i])[1]))


def _group(combo: list[str]) -> tuple[tuple[str, ...], int]:
    accum = next((o.partition("=")[2] for o in combo if key_of(o) == "grad_accum"), "1")
    return tuple(o for o in combo if key_of(o) != "grad_accum"), int(accum) if accum.isdigit() else 1


def _predicted(combo: list[str], name: str, predict: Predict, seen: dict[str, str]) -> dict[str, Any]:
    try:
        composed = compose_one(combo)
        key = json.dumps([composed.strategy_name, composed.config], sort_keys=True, default=str)
        if key in seen:
            return {"status": "pruned", "reason": f"{SAME} ({seen[key]})"}
        seen[key] = name
        return predict(combo, composed.run)
    except ConfigError as error:  # e.g. a grad_accum that does not divide a rank's batch there
        return {"status": "refused", "reason": str(error)}


def _said(row: dict[str, Any]) -> str:
    if row["status"] == "predicted":
        return "predicted" if row["prediction"]["fits"] else f"{NOT_FIT}: {row['reason']}"
    return f"{row['status']}: {row['reason']}"


# ---- the answer ----

@dataclass(frozen=True)
class PresetAnswer:
    hardware: str
    nodes: int
    space: int
    ranked: list[dict[str, Any]]  # the rows predicted to fit, fastest first
    pruned: list[tuple[str, str, str]]  # (why, as grouped; the candidate; in full)
    lines: list[str] = field(default_factory=list)  # the answer, as the terminal and plan.md say it

    @property
    def winner(self) -> dict[str, Any] | None:
        return self.ranked[0] if self.ranked else None

    @property
    def runner_up(self) -> dict[str, Any] | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    def groups(self) -> dict[str, int]:
        """How many were pruned for each reason: not fitting, then larger micro-batches, then the rest."""
        counts: dict[str, int] = {}
        for why, _, _ in sorted(self.pruned, key=lambda p: (NOT_FIT, LARGER_MICRO, SAME, p[0]).index(p[0])):
            counts[why] = counts.get(why, 0) + 1
        return counts

    def as_json(self) -> dict[str, Any]:
        def one(row: dict[str, Any] | None) -> dict[str, Any] | None:
            if row is None:
                return None
            p = row["prediction"]
            return {"name": row["name"], "overrides": row["overrides"], "command": command(row["overrides"]),
                    "rate": rate(row), "rate_band": [b * (row.get("tokens_per_sample") or 1) if b else None
                                                     for b in p["throughput_band"]],
                    "unit": row.get("unit"), "tokens_per_sample": row.get("tokens_per_sample"),
                    "s_per_iteration": p["s_per_iteration"],
                    "s_per_iteration_band": p["s_per_iteration_band"], "peak_mib": p["peak_mib"],
                    "device_memory_mib": p["device_memory_mib"]}

        return {"hardware": self.hardware, "nodes": self.nodes, "space": self.space, "predicted_to_fit": len(self.ranked),
                "winner": one(self.winner), "runner_up": one(self.runner_up),
                "pruned": [{"why": why, "name": name, "reason": reason} for why, name, reason in self.pruned],
                "pruned_by_reason": self.groups(), "answer": self.lines}

    def markdown(self, figure: Callable[[dict[str, Any]], tuple[str, str]]) -> list[str]:
        lines = [f"# Search on {self.hardware}: predicted, nothing trained", "", *[f"    {line}" for line in self.lines],
                 ""]
        if self.ranked:
            lines += ["## Predicted to fit, fastest first", "",
                      "| # | combination | throughput | 90 % band | time | peak of a device |",
                      "|---|---|---|---|---|---|"]
            for place, row in enumerate(self.ranked, 1):
                p = row["prediction"]
                lines.append(f"| {place} | {row['name']} | {' | '.join(figure(row))} | {_ms(p)} | "
                             f"{_size(p['peak_mib'])} of {_size(p['device_memory_mib'])} |")
            lines.append("")
        if self.pruned:
            lines += [f"## Pruned ({len(self.pruned)} of {self.space})", ""]
            for why, count in self.groups().items():
                lines.append(f"- {why} ({count}):")
                lines += [f"  - {name}{f': {reason}' if reason else ''}" for w, name, reason in self.pruned if w == why]
            lines.append("")
        return lines


def answer(rows: Sequence[dict[str, Any]], hardware: str, nodes: int, margin: float,
           figure: Callable[[dict[str, Any]], tuple[str, str]]) -> PresetAnswer:
    """`figure(row)`: the row's predicted throughput and its 90 % band, in its unit (tokens/s for a language
    model), as plan=true words them."""
    fitting = [r for r in rows if r["status"] == "predicted" and r["prediction"]["fits"] and rate(r)]
    ranked = sorted(fitting, key=lambda r: -rate(r))  # stable: of two equal, the one the space lists first
    pruned = [_pruned(r) for r in rows if r not in fitting]
    outcome = PresetAnswer(hardware, nodes, len(rows), ranked, pruned)
    return replace(outcome, lines=_lines(outcome, margin, figure))


def _pruned(row: dict[str, Any]) -> tuple[str, str, str]:
    reason = str(row.get("reason") or "")
    if row["status"] == "predicted":
        return (NOT_FIT, row["name"], reason) if not row["prediction"]["fits"] else \
            ("predicted no time", row["name"], reason)
    for why in (LARGER_MICRO, SAME):
        if reason.startswith(why):
            return why, row["name"], reason.removeprefix(why).strip(" ()")
    return f"{row['status']}: {reason}", row["name"], ""


def _lines(outcome: PresetAnswer, margin: float, figure: Callable[[dict[str, Any]], tuple[str, str]]) -> list[str]:
    lines = [f"Search on {outcome.hardware} (predicted, nothing trained): {outcome.space} candidates, "
             f"{len(outcome.ranked)} predicted to fit, {len(outcome.pruned)} pruned"]
    best, second = outcome.winner, outcome.runner_up
    if best is not None:
        throughput, band = figure(best)
        p = best["prediction"]
        lines.append(f"Fastest predicted: {best['name']}: {throughput} (90 % band {band}), {_ms(p)}, peak "
                     f"{_size(p['peak_mib'])} of {_size(p['device_memory_mib'])} a device")
    if second is not None and best is not None:
        throughput, band = figure(second)
        ratio = rate(best) / rate(second)
        close = f"; within {100 * margin:.0f} %: too close for a prediction to decide, measure both" \
            if ratio < 1 + margin else ""
        lines.append(f"Runner-up: {second['name']}: {throughput} (90 % band {band}); the winner is {ratio:.2f}x "
                     f"as fast{close}")
    if outcome.pruned:
        lines.append(f"Pruned {len(outcome.pruned)} of {outcome.space}: " +
                     ", ".join(f"{count} {why}" for why, count in outcome.groups().items()))
    if best is not None:
        where = f" (on each of its {outcome.nodes} nodes, under torchrun: docs/clusters.md)" if outcome.nodes > 1 else ""
        on = "here" if outcome.hardware == LOCAL else f"on {outcome.hardware}{where}"
        lines.append(f"Train it {on}: {command(best['overrides'])}")
    return lines


def rate(row: dict[str, Any]) -> float:
    """The predicted rate in the row's unit: samples/s, or tokens/s for a language model."""
    samples = row["prediction"].get("throughput_img_s") or 0.0
    return samples * (row.get("tokens_per_sample") or 1)


def command(overrides: Sequence[str]) -> str:
    """`python run.py model=gpt strategy=fsdp amp=O1 amp.dtype=bfloat16 grad_accum=2`: the candidate as one
    training run on the cluster, without the search's and the plan's keys."""
    return training_command([o for o in overrides if key_of(o).partition(".")[0] not in PLAN_KEYS])


def _ms(prediction: dict[str, Any]) -> str:
    """`2.91 ms an iteration (band 1.95–4.35)`, or `20.1 s an iteration (band 13.4–29.9)` from a second."""
    low, high = prediction.get("s_per_iteration_band") or (None, None)
    seconds = prediction["s_per_iteration"]
    scale, unit = (1, "s") if seconds >= 1 else (1000, "ms")

    def three(value: float) -> str:
        return f"{value * scale:,.0f}" if value * scale >= 100 else f"{value * scale:#.3g}"

    total = f"{three(seconds)} {unit} an iteration"
    return f"{total} (band {three(low)}–{three(high)})" if low and high else total


def _size(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB" if mib >= 10 else f"{mib:.2g} MiB"


def nothing_fits(found: PresetAnswer, folder: str) -> ConfigError:
    """No candidate predicted to fit on the preset: bad input, in one line."""
    counts = ", ".join(f"{count} {why}" for why, count in found.groups().items())
    example = next((reason for why, _, reason in found.pruned if why == NOT_FIT and reason), "")
    return ConfigError("search", "true", f"a space with a combination predicted to fit on {found.hardware}: none of "
                       f"the {found.space} does ({counts}{f'; e.g. {example}' if example else ''}); every "
                       f"prediction: {folder}")
