"""`python run.py -m search=true plan=true plan.hardware=<preset>`: a layout found without running, for a cluster
not rented yet (docs/search.md). The space is the search's (harness.search.shortlist), with the axes that matter on
a GPU preset: data parallelism (ddp, zero), sharding (fsdp, and HSDP on several nodes), tensor parallelism (fsdp at
TP degrees within a node, and strategy=tp over one node) and pipelines (pp, at the microbatch counts that cut its
batch). Every candidate is predicted on the preset by the caller's `predict` (harness.launch.on_preset's
`predict_on`, as plan=true does) and nothing is trained. What would not fit there, or cannot run there, is pruned
with its reason; a micro-batch larger than one predicted not to fit is pruned without being predicted (memory only
grows with the micro-batch); on a GPU preset, so is one smaller than the largest that fits (a step of smaller
micro-batches is predicted no faster), except a pipeline's (more microbatches shrink its bubble); a candidate that
composes the config of one already predicted is not predicted again. The answer: the fastest predicted combination
with its band, the runner-up, what was pruned and why, and the command that trains the winner on the cluster."""

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
from harness.search.space import Axis, all_axes, check_axes, key_of, swept
from harness.verdict.rounds import combination_names

log = logging.getLogger(__name__)

# The axes searched on a GPU preset unless search.axes names others: what decides a large model's speed there.
# compile's fusions are not predicted (harness.prediction), and a DDP bucket size or a compression hook (bucket,
# comm_hook) moves a prediction over NVLink little: each is searched where search.axes names it.
PRESET_AXES = ("strategy", "amp", "micro_batch", "checkpoint")
# the strategies that use every GPU of a cluster, those of them conf/strategy/ has; tensor parallelism over every
# rank (tp) only on one node: torchtitan keeps a TP group within a node, whose links carry each block's activations
PRESET_STRATEGIES = ("ddp", "zero", "fsdp", "tp", "pp")
ONE_NODE_ONLY = ("tp",)
# on more than one node, a strategy with this option (fsdp) is also searched as HSDP sharded within each node:
# `strategy.replicate=<nodes>` (all-gathers on the node's own links, one gradient shard all-reduced across nodes)
REPLICATE = "strategy.replicate"
# a strategy with this option (fsdp) is also searched as FSDP x TP at the degrees of tp_degrees()
TP = "strategy.tp"
# a pipeline's microbatches (pp): its micro-batch axis, in place of grad_accum (which it refuses above 1)
MICROBATCHES = "strategy.microbatches"
PRESET_AMP = ("O0", "O1")
HALF = "bfloat16"  # O1 on a GPU preset: bfloat16 autocast (amp.dtype's auto is float16 on CUDA), unless typed

NOT_FIT = "predicted not to fit"
LARGER_MICRO = "larger micro-batch than one that does not fit"
SMALLER_MICRO = "smaller micro-batch than the largest that fits"
SAME = "the same config as another candidate"
MICRO_KEYS = ("grad_accum", MICROBATCHES)  # what sets a candidate's micro-batch: accumulation, or a pipeline's cut
PLAN_KEYS = ("plan", "search", "sweep", "hydra")  # a search's keys, not the training run's


@dataclass(frozen=True)
class Space:
    candidates: list[list[str]]  # each candidate's overrides, the search's own keys included
    names: list[str]  # as the progress lines, plan.md and plan.json name them
    axes: list[str]  # what was searched, in words (`micro_batch (grad_accum): 1, 2, 4`)
    hardware: str
    nodes: int
    # on a GPU preset: of the micro-batches of one candidate, only the largest that fits is predicted (predict_all)
    largest_fit: bool = False


def preset_space(overrides: Sequence[str], base: RunConfig) -> Space:
    """The candidates of a search on `base.plan.hardware`. On a GPU preset, unless `search.axes` is typed, the axes
    are PRESET_AXES; the strategies those of PRESET_STRATEGIES that exist (tp on one node only), amp O0 and O1 with
    bfloat16 autocast, the micro-batch every power of two that divides a rank's share of the global batch
    (grad_accum 1, 2, 4, ... while the micro-batch is at least 1; a pipeline's microbatches instead), activation
    checkpointing the values the model's signature allows. On any GPU preset each candidate of a strategy that takes
    `strategy.tp` (fsdp) also as FSDP x TP at tp_degrees(); on more than one node (plan.nodes), each one without TP
    also as HSDP with one replica a node; a key the command line types is kept instead."""
    hardware = base.plan.hardware
    preset = load_preset(hardware) if hardware != LOCAL else None
    gpu = preset is not None and preset.accelerator == "cuda"
    typed_axes = any(key_of(o) == "search.axes" for o in overrides)
    names = list(base.search.axes) if typed_axes or not gpu else list(PRESET_AXES)
    axes = check_axes(names)
    nodes = nodes_of(base, preset) if preset is not None else 1
    if gpu:
        have = {p.stem for p in (CONF_DIR / "strategy").glob("*.yaml")}
        strategies = tuple(s for s in PRESET_STRATEGIES if s in have and not (nodes > 1 and s in ONE_NODE_ONLY))
        preset_values = {"strategy": strategies, "amp": PRESET_AMP}
        axes = [replace(a, values=preset_values.get(a.key, a.values)) for a in axes]
    typed = {key_of(o) for o in overrides}
    hybrid = gpu and nodes > 1 and REPLICATE not in typed
    degrees = tp_degrees(preset, nodes, "tp" in candidate_strategies(overrides, axes)) \
        if gpu and preset is not None and TP not in typed else ()
    pipeline = gpu and MICROBATCHES not in typed
    # right after the strategy axis, in this order: the TP degree (1: plain FSDP, dropped below), the microbatches of
    # a pipeline, and HSDP's replicas (1, dropped below, and <nodes>; only without TP: HSDP x TP is not wired)
    added = [*([Axis(TP, degrees)] if len(degrees) > 1 else []), *([Axis(MICROBATCHES, ())] if pipeline else []),
             *([Axis(REPLICATE, ("1", str(nodes)))] if hybrid else [])]
    at = next((i + 1 for i, a in enumerate(axes) if a.key == all_axes()["strategy"].key), 0)
    axes = [*axes[:at], *added, *axes[at:]]
    every_micro = "micro_batch" in names

    def values_on(config: Composed, axis: Axis) -> Sequence[str] | None:
        if preset is not None and axis.key == all_axes()["micro_batch"].key:
            return micro_batches(config.run, preset, nodes)
        if axis.key == MICROBATCHES:  # a pipeline's alone (fsdp has the key for FSDP x PP, not searched here)
            return pipeline_microbatches(config.run, preset, nodes, every_micro) \
                if preset is not None and _pipeline(config.run) else None
        if axis.key == REPLICATE and _option(config.run, "tp", 1) != 1:
            return None  # HSDP x TP is not wired
        return option_values(config, axis)

    found = space(overrides, base.search, axes, values_on)
    if len(degrees) > 1 or hybrid:  # plain FSDP as the command line spells it, without `strategy.tp=1`, `...replicate=1`
        found = [[o for o in c if o not in (f"{TP}=1", f"{REPLICATE}=1")] for c in found]
    if pipeline and "grad_accum" not in typed:  # a pipeline's accumulation is its microbatches: no grad_accum=1 said
        found = [[o for o in c if o != "grad_accum=1"] if any(key_of(o) == MICROBATCHES for o in c) else c
                 for c in found]
    if gpu:
        found = [with_half(c) for c in found]
    hsdp = f"{REPLICATE}={nodes}"  # one value left once plain FSDP's 1 is dropped: named here, not as varying
    searched_keys = {a.key for a in added}  # named after the strategy and amp level, not among the varying keys

    def describe(i: int) -> str:
        own = dict(o.partition("=")[::2] for o in found[i])
        extra = [f"{k.removeprefix('strategy.')}={own[k]}" for k in (TP, MICROBATCHES) if k in searched_keys and k in own]
        return " ".join([_describe(found[i]), *extra]) + (f" replicate={nodes}" if hybrid and hsdp in found[i] else "")

    named = combination_names([[o for o in c if not o.startswith("amp.dtype=") and key_of(o) not in searched_keys - {
        REPLICATE}] for c in found], describe)
    said = [f"{name}{f' ({key})' if key != name else ''}: {', '.join(searched(found, key)) or 'applies to none'}"
            for name, key in ((n, all_axes()[n].key) for n in names)]
    if len(degrees) > 1 and searched(found, TP):
        whole = f"; tp: TP over the node's {preset.devices_per_node} GPUs" if "tp" in searched(found, "strategy") \
            else ""
        said.append(f"tensor parallel ({TP}): fsdp also at TP {', '.join(searched(found, TP))} within a node{whole}")
    if pipeline and searched(found, MICROBATCHES):
        said.append(f"pipeline microbatches ({MICROBATCHES}): {', '.join(searched(found, MICROBATCHES))}, in place "
                    "of grad_accum")
    if hybrid and searched(found, REPLICATE):
        said.append(f"HSDP ({hsdp}): sharded within each of the {nodes} nodes, beside plain FSDP")
    if gpu and "amp=O1" in {o for c in found for o in c}:
        said.append(f"O1 as {HALF} autocast (amp.dtype={HALF})")
    return Space(found, named, said, hardware, nodes, largest_fit=gpu)


def candidate_strategies(overrides: Sequence[str], axes: Sequence[Axis]) -> list[str]:
    """The strategies the space will hold: as typed (one, or a comma list), else the strategy axis's values."""
    typed = next((o for o in overrides if key_of(o) == "strategy"), None)
    if typed is not None:
        return swept(typed) or [typed.partition("=")[2]]
    return [v for a in axes if a.key == "strategy" for v in a.values]


def tp_degrees(preset: Preset, nodes: int, plain_tp: bool) -> tuple[str, ...]:
    """The TP degrees fsdp is searched at: 1 (plain FSDP), 2 (the least TP: each block's activations all-reduced
    between two GPUs, FSDP over half the ranks) and the node's GPUs (torchtitan's degree for the largest models),
    each dividing the node's GPUs: a TP group stays within a node, on its fastest links. On one node, where
    strategy=tp is a candidate, the node's GPUs are that strategy's (FSDP over a data-parallel dim of one rank
    is the same layout) and not searched again here."""
    width = preset.devices_per_node
    found = [d for d in dict.fromkeys((1, 2, width)) if width % d == 0]
    if plain_tp and nodes == 1:
        found = [d for d in found if d == 1 or d != width]
    return tuple(str(d) for d in found)


def nodes_of(cfg: RunConfig, preset: Preset) -> int:
    """The preset's nodes (a `plan.nodes` of the config, where it has one, in their place)."""
    nodes = getattr(cfg.plan, "nodes", None)
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1 else preset.nodes


def micro_batches(cfg: RunConfig, preset: Preset, nodes: int) -> tuple[str, ...]:
    """grad_accum 1, 2, 4, ...: each a power of two that divides a rank's share of the global batch, down to
    micro-batches of one sample. A strategy with one process per device has every device of the preset's nodes;
    another one process (its batch is its own). The ranks of a tensor-parallel group share one share (strategy=tp:
    every rank the whole batch); a pipeline accumulates over its microbatches instead (grad_accum 1 alone)."""
    cls = get_class(cfg.strategy["_target_"])
    world = preset.devices_per_node * nodes if cls.one_process_per_device else 1
    traffic = cls.traffic(cfg.strategy)
    if traffic.microbatches:
        return ("1",)
    per_rank = max(1, cfg.batch_size // max(1, world // traffic.tensor_parallel_over(world)))
    found, accum = [], 1
    while accum <= per_rank and per_rank % accum == 0:
        found.append(str(accum))
        accum *= 2
    return tuple(found)


def pipeline_microbatches(cfg: RunConfig, preset: Preset, nodes: int, every: bool) -> tuple[str, ...]:
    """A pipeline's microbatches: the global batch cut in 2, 4, 8, ... (each a power of two that divides it), of at
    least the ranks (a pipeline of that many stages is idle most of a step with fewer; torch's 1F1B refuses
    fewer), the fewest first (the largest microbatch); `every=False` (no micro_batch axis): the fewest alone. A
    batch smaller than the ranks: the batch in microbatches of one sample (refused with its reason where the
    schedule needs more)."""
    ranks = preset.devices_per_node * nodes
    found, count = [], 1
    while count <= cfg.batch_size and cfg.batch_size % count == 0:
        if count >= ranks:
            found.append(str(count))
        count *= 2
    found = found or [str(cfg.batch_size)]
    return tuple(found if every else found[:1])


def _pipeline(cfg: RunConfig) -> bool:
    """The strategy runs a pipeline (its declared traffic has microbatches)."""
    return bool(get_class(cfg.strategy["_target_"]).traffic(cfg.strategy).microbatches)


def _option(cfg: RunConfig, name: str, default: Any) -> Any:
    """A strategy option as the composed config has it (absent: `default`)."""
    return (cfg.strategy or {}).get(name, default)


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
    """Every candidate's row (plan.json's), in the space's order. Predicted in groups that differ only in their
    micro-batch (grad_accum, or a pipeline's microbatches). Memory only grows with the micro-batch, so a micro-batch
    larger than one predicted not to fit is pruned without its prediction. On a GPU preset (`found.largest_fit`) a
    group's time does not grow with its micro-batch either: each micro-step repeats the same kernels, collectives and
    launches on fewer samples, so only the largest micro-batch that fits is looked for, by bisection, and the smaller
    ones are pruned without their predictions; a pipeline's group is the exception, as more microbatches shrink its
    bubble: as elsewhere, every micro-batch is predicted, the smallest first, up to the first that does not fit. A
    candidate composing a config already predicted is not predicted again."""
    rows: dict[int, dict[str, Any]] = {}
    seen: dict[str, str] = {}  # a composed config -> the candidate that predicted it
    groups = micro_groups(found.candidates)
    spent: list[float] = []  # each finished group's seconds

    def settle(index: int, row: dict[str, Any]) -> None:
        rows[index] = row
        left = sum(spent) / len(spent) * (len(groups) - len(spent)) if spent and len(rows) < len(found.candidates) \
            else None
        timing = f" ({row['seconds']:.1f} s{f'; about {left:.0f} s left' if left is not None else ''})" \
            if "seconds" in row else ""
        log.info("search: %d/%d %s: %s%s", len(rows), len(found.candidates), row["name"], _said(row), timing)

    def probe(index: int) -> dict[str, Any]:
        row: dict[str, Any] = {"name": found.names[index], "overrides": found.candidates[index],
                               "hardware": found.hardware}
        began = time.perf_counter()
        row.update(_predicted(found.candidates[index], found.names[index], predict, seen))
        if row["status"] == "predicted":
            row["seconds"] = round(time.perf_counter() - began, 2)
        settle(index, row)
        return row

    def pruned(index: int, why: str, by: int) -> None:
        settle(index, {"name": found.names[index], "overrides": found.candidates[index], "hardware": found.hardware,
                       "status": "pruned", "reason": f"{why} ({found.names[by]})"})

    fitted: dict[tuple[Any, ...], int] = {}  # (a group but for its amp level, its size) -> how many fit, last seen
    for members in groups:
        began = time.perf_counter()
        first = found.candidates[members[0]]
        pipeline = any(key_of(o) == MICROBATCHES for o in first)
        if found.largest_fit and not pipeline:
            like = (tuple(o for o in _group(first)[0] if key_of(o).partition(".")[0] != "amp"), len(members))
            fit = _largest_that_fits(members, probe, pruned, lambda i: found.names[i], fitted.get(like))
            if fit is not None:
                fitted[like] = fit
        else:
            _smallest_first(members, probe, pruned)
        spent.append(time.perf_counter() - began)
    return [rows[i] for i in range(len(found.candidates))]


def _fits(row: dict[str, Any]) -> bool | None:
    """Whether a probe's prediction fits; None where it made none (refused, skipped, not predicted, the same)."""
    return bool(row["prediction"]["fits"]) if row["status"] == "predicted" else None


def _smallest_first(members: Sequence[int], probe: Callable[[int], dict[str, Any]],
                    pruned: Callable[[int, str, int], None]) -> None:
    """Every micro-batch predicted, the smallest first, until one does not fit: the larger ones pruned."""
    misfit: int | None = None
    for index in members:
        if misfit is not None:
            pruned(index, LARGER_MICRO, misfit)
        elif _fits(probe(index)) is False:
            misfit = index


def _largest_that_fits(members: Sequence[int], probe: Callable[[int], dict[str, Any]],
                       pruned: Callable[[int, str, int], None], name_of: Callable[[int], str],
                       hint: int | None = None) -> int | None:
    """Bisection for the largest micro-batch that fits (`members`: smallest first; memory grows along them); the
    number of members that fit, or None where it could not tell. `hint`: that number in a group like this one (the
    same but for its amp level), probed first on either side of its boundary, the side expected not to fit (the
    cheaper prediction: no time) first: where it holds, two predictions decide the group (one where it is 0 or every
    member). The smaller ones are pruned for the largest that fits (one probed on the way keeps its prediction in its
    row, so that every group is ranked by its largest micro-batch alone, whichever were probed), the larger ones not
    probed for the smallest that does not. A probe that makes no prediction (refused, skipped...) leaves the fit
    unknown: the group's rest is predicted smallest first."""
    low, high, probed = 0, len(members), {}
    guesses = [] if hint is None else [g for g in (hint, hint - 1) if 0 <= g < len(members)]
    while low < high:
        middle = next((g for g in guesses if low <= g < high and g not in probed), (low + high) // 2)
        probed[middle] = probe(members[middle])
        fits = _fits(probed[middle])
        if fits is None:
            _smallest_first([m for i, m in enumerate(members) if i not in probed], probe, pruned)
            return None
        low, high = (middle + 1, high) if fits else (low, middle)
    for i, index in enumerate(members):
        if i < low - 1 and i in probed:
            probed[i].update(status="pruned", reason=f"{SMALLER_MICRO} ({name_of(members[low - 1])})")
        elif i not in probed:
            pruned(index, *((SMALLER_MICRO, members[low - 1]) if i < low else (LARGER_MICRO, members[low])))
    return low


def micro_groups(candidates: Sequence[list[str]]) -> list[list[int]]:
    """The candidates' indices in groups that differ only in their micro-batch, each group where its first member
    appears, its members smallest micro-batch first (the most micro-steps: grad_accum x microbatches)."""
    found: dict[tuple[str, ...], list[int]] = {}
    for index, combo in enumerate(candidates):
        found.setdefault(_group(combo)[0], []).append(index)
    return [sorted(members, key=lambda i: -_group(candidates[i])[1]) for members in found.values()]


def _group(combo: list[str]) -> tuple[tuple[str, ...], int]:
    """(everything but the micro-batch's keys, the micro-steps: grad_accum x a pipeline's microbatches)."""
    steps = 1
    for o in combo:
        if key_of(o) in MICRO_KEYS:
            value = o.partition("=")[2]
            steps *= int(value) if value.isdigit() else 1
    return tuple(o for o in combo if key_of(o) not in MICRO_KEYS), steps


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
        for why, _, _ in sorted(self.pruned, key=lambda p: (NOT_FIT, LARGER_MICRO, SMALLER_MICRO, SAME,
                                                            p[0]).index(p[0])):
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
    for why in (LARGER_MICRO, SMALLER_MICRO, SAME):
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
