"""harness/search/space.py: the combinations a search covers, each axis only where its key means something, and
what the user types fixing a key or sweeping it; harness/search/prune.py: what the predictions leave out and why,
on predictions worked by hand."""

from __future__ import annotations

import pytest

from harness.core.errors import ConfigError
from harness.prediction.predict import Prediction, RankMemory
from harness.search.prune import per_sample_s, prune
from harness.search.space import all_axes, check_axes, combinations, searchable_strategies

# which strategies have which option (as their composed configs do): DDP and ZeRO a bucket size, FSDP2 none
HAS = {"ddp": {"strategy.bucket_cap_mb", "strategy.comm_hook"}, "zero": {"strategy.bucket_cap_mb", "strategy.comm_hook"},
       "fsdp": {"strategy.comm_hook"}, "single": set()}


def has_key(overrides: list[str], key: str) -> bool:
    strategy = next(o.partition("=")[2] for o in overrides if o.startswith("strategy="))
    return key in HAS[strategy] or (key == "model.checkpoint" and "model=gpt" in overrides)


def test_an_axis_is_crossed_only_where_its_key_exists():
    found = combinations([], check_axes(["strategy", "bucket"]), has_key)
    assert found == [["strategy=single"],
                     ["strategy=ddp", "strategy.bucket_cap_mb=25"], ["strategy=ddp", "strategy.bucket_cap_mb=100"],
                     ["strategy=zero", "strategy.bucket_cap_mb=25"], ["strategy=zero", "strategy.bucket_cap_mb=100"],
                     ["strategy=fsdp"]]


def test_the_default_space_counts_by_hand():
    """ddp and zero: 2 amp x 3 micro-batches x 2 buckets x 2 hooks x 2 compile = 48 each; fsdp: no bucket, 24;
    single: neither, 12; checkpointing applies to no model here (tiny_cnn): 132 in all."""
    found = combinations(["model=tiny_cnn"], list(all_axes().values()), has_key)
    assert len(found) == 12 + 48 + 48 + 24 and len({tuple(c) for c in found}) == len(found)
    assert all(c[0] == "model=tiny_cnn" for c in found)
    with_gpt = combinations(["model=gpt"], list(all_axes().values()), has_key)
    assert len(with_gpt) == 2 * 132  # checkpointing off and on


def test_the_default_space_holds_single_the_baseline_a_user_would_otherwise_run():
    """On a CPU (strategy, amp, micro_batch, config.py's default there) and on GPUs (every axis), `single` is a
    candidate: a search must not answer ddp when single, left out, was faster. CPU: 4 strategies x 2 amp x 3
    micro-batches = 24, 6 of them single."""
    from harness.core.config import SearchConfig

    cpu = combinations([], check_axes(SearchConfig().axes), has_key)
    assert len(cpu) == 4 * 2 * 3 and sum("strategy=single" in c for c in cpu) == 2 * 3
    assert cpu[0] == ["strategy=single", "amp=O0", "grad_accum=1"]
    gpu = combinations([], list(all_axes().values()), has_key)
    assert sum("strategy=single" in c for c in gpu) == 2 * 3 * 2  # amp x micro-batch x compile


def test_what_the_user_types_fixes_a_key_or_is_an_axis_of_its_own():
    fixed = combinations(["amp=O1", "strategy=fsdp"], check_axes(["strategy", "amp", "micro_batch"]), has_key)
    assert fixed == [["amp=O1", "strategy=fsdp", "grad_accum=1"], ["amp=O1", "strategy=fsdp", "grad_accum=2"],
                     ["amp=O1", "strategy=fsdp", "grad_accum=4"]]
    own = combinations(["strategy=ddp", "model.seq_len=64,128"], check_axes(["comm_hook"]), has_key)
    assert own == [["strategy=ddp", "model.seq_len=64", "strategy.comm_hook=none"],
                   ["strategy=ddp", "model.seq_len=64", "strategy.comm_hook=bf16"],
                   ["strategy=ddp", "model.seq_len=128", "strategy.comm_hook=none"],
                   ["strategy=ddp", "model.seq_len=128", "strategy.comm_hook=bf16"]]


def test_the_axes_are_the_ones_the_config_allows():
    """search.axes is checked in the parent against SEARCH_AXES (harness.core.config); the space knows each."""
    from harness.core.config import SEARCH_AXES

    assert tuple(all_axes()) == SEARCH_AXES


def test_the_strategy_axis_is_the_strategies_that_declare_themselves_searchable():
    """No list of names in the space: conf/strategy/'s classes say `searchable`, ordered from the baseline to the
    most sharded, so the space (and the order its combinations run in) is what it was when the list was written."""
    from strategies.compat import strategy_classes

    classes = strategy_classes()
    assert {name for name, cls in classes.items() if cls.searchable} == {"single", "ddp", "zero", "fsdp"}
    assert searchable_strategies() == ("single", "ddp", "zero", "fsdp") == all_axes()["strategy"].values


def test_a_strategy_declared_searchable_joins_the_axis_in_its_place():
    """A new strategy needs its `searchable` only: it takes its place by its layout (one process before a process
    group, then by what it shards, then by name)."""
    from strategies.compat import strategy_classes

    class Sharded:
        searchable, one_process_per_device, shards = True, True, (True, True, True)

    class OnlyOptimizerState(Sharded):
        shards = (False, False, True)

    class Unlisted(Sharded):
        searchable = False

    classes = {**strategy_classes(), "hsdp": Sharded, "adam_shards": OnlyOptimizerState, "textbook": Unlisted}
    assert searchable_strategies(classes) == ("single", "ddp", "adam_shards", "zero", "fsdp", "hsdp")


@pytest.mark.parametrize("axes", [["strategy", "precision"], [], ["amp", "amp"]])
def test_an_unknown_empty_or_repeated_axis_list_is_named(axes):
    with pytest.raises(ConfigError, match="search.axes=.* is not allowed: a list of distinct axes from strategy, amp"):
        check_axes(axes)


def predicted(s_per_iteration: float, global_batch: int = 32, peak_mib: float = 100, band: float = 1.0,
              device_mib: float = 1000) -> Prediction:
    rank = RankMemory("cpu:0", peak_mib, 0, 0, 0, 0, 0, 0)
    return Prediction(hardware="here", world_size=1, ranks=(rank,), device_memory_mib=device_mib, shared_memory=False,
                      compute_s=s_per_iteration, optimizer_s=0, comm_s=0, exposed_comm_s=0, flops_per_iteration=1,
                      global_batch=global_batch, assumptions=(), time_band=(band, 1 / band))


def test_prune_keeps_what_is_near_the_best_per_sample_and_names_what_it_drops():
    """Per sample: a 0.32 s / 32 = 10 ms (the best); b 0.80 s / 32 = 25 ms, 2.5x; c 0.40 s / 16 = 25 ms too,
    but its band's fast end (x0.7) is 17.5 ms = 1.75x; d does not fit; e has no prediction."""
    predictions = {"a": predicted(0.32), "b": predicted(0.80), "c": predicted(0.40, global_batch=16, band=0.7),
                   "d": predicted(0.01, peak_mib=2000), "e": None}
    assert per_sample_s(predictions["c"]) == pytest.approx(0.025)
    kept, pruned = prune(predictions, 2.0, {"a": "ddp O1"})
    assert kept == ["a", "c", "e"]
    reasons = {p.key: p.reason for p in pruned}
    assert reasons["b"].startswith("predicted 2.5x the time per sample of ddp O1 (at best 2.5x")
    assert reasons["d"].startswith("predicted not to fit: predicted peak")  # d is fastest, but cannot run
    kept_wide, _ = prune(predictions, 3.0, {})
    assert kept_wide == ["a", "b", "c", "e"]
