"""What adding a measured figure touches, shown on the figures the harness has (as tests/plugins/ shows what
adding a strategy touches): the rank code that measures it, its RankRecord field declared `merged(how)`
(harness/core/rank_record.py), its RunRecord field of the same name (harness/core/results.py, the schema
regenerated) and a Column pooling it over a row's runs (harness/report/columns.py, `per_run`). Nothing between
them names it: the runner merges every declared field by attribute, a row holds its runs' records."""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from conftest import run_config

from harness.core.rank_record import MERGE, MERGES, RankRecord
from harness.core.results import RankEntry, RunRecord
from harness.launch.decide import run_plan as plan
from harness.launch.placement import Hardware
from harness.launch.runner import measured, planned
from harness.report.columns import csv_table
from harness.report.rows import row_set

REPO = Path(__file__).resolve().parents[1]
RUN_TYPES = typing.get_type_hints(RunRecord)
MERGED = {f.name: f.metadata[MERGE] for f in dataclasses.fields(RankRecord) if MERGE in f.metadata}


def example(kind: Any, seed: int) -> Any:
    """A value of results.json's type `kind` that tells rank `seed`'s apart from another rank's: a number,
    a word, a record's mapping with every field filled."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    if dataclasses.is_dataclass(kind):
        return {name: example(inner, seed) for name, inner in typing.get_type_hints(kind).items()
                if not name.startswith("__")}
    origin = typing.get_origin(kind) or kind
    return {bool: True, int: 10 + seed, float: 2.5 + seed, str: f"rank {seed}", dict: {}, list: []}[origin]


def two_ranks(values: dict[str, tuple[Any, Any]]) -> list[RankRecord]:
    return [RankRecord(rank=rank, **{name: pair[rank] for name, pair in values.items()}) for rank in (0, 1)]


def merged_over(records: list[RankRecord]) -> RunRecord:
    decided = plan(run_config("ddp", batch_size=8, iterations=60), Hardware(visible_gpus=(), cores=4))
    return measured(planned(decided, None), decided, records, started=0.0)


def test_every_figure_the_ranks_merge_is_a_run_field_and_merges_as_declared():
    assert set(MERGED) >= {"compile_seconds", "memory_theory", "kernels", "stopped_by"}
    assert set(MERGED) <= set(RUN_TYPES), "a `merged` figure needs RunRecord's field of the same name"
    assert set(MERGED.values()) <= {"rank0", *MERGES}
    values = {name: (example(RUN_TYPES[name], 0), example(RUN_TYPES[name], 1)) for name in MERGED}
    record = merged_over(two_ranks(values))
    for name, how in MERGED.items():
        zero, one = values[name]
        want = {"rank0": zero, "first": zero, "max": max(zero, one) if how == "max" else None,
                "sum": zero + one if how == "sum" else None}[how]
        got = getattr(record, name)
        assert (dataclasses.asdict(got) if dataclasses.is_dataclass(got) else got) == want, name


def test_a_rank_without_the_figure_leaves_it_to_the_others_and_none_leaves_it_unset():
    only_one = merged_over([RankRecord(rank=0), RankRecord(rank=1, compile_seconds=3.0)])
    assert only_one.compile_seconds == 3.0 and only_one.memory_theory is None and only_one.stopped_by is None


def test_every_per_rank_figure_is_the_rank_records_field_of_the_same_name():
    """results.json's `ranks` entries: RankEntry's fields, each read off RankRecord's field of that name."""
    assert {f.name for f in dataclasses.fields(RankEntry)} <= {f.name for f in dataclasses.fields(RankRecord)}
    entry = RankRecord(rank=3, pid=42, tensor_peak_mib=1.5, params_held_mib=0.25).summary()
    assert (entry.rank, entry.pid, entry.tensor_peak_mib, entry.params_held_mib, entry.allocator) == (3, 42, 1.5, 0.25, [])


def test_the_runners_merge_names_no_figure_the_ranks_declare():
    """`measured` (harness/launch/runner.py) reads no declared figure off a rank's record, nor passes one to the
    record by name: adding a figure is no line there (the one word it says, `compile_seconds`, is the XLA
    fallback for a run whose ranks timed no compile pass: their graphs compiled inside the windows)."""
    tree = ast.parse((REPO / "harness/launch/runner.py").read_text())
    merge = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "measured")
    named = [node.attr for node in ast.walk(merge) if isinstance(node, ast.Attribute) and node.attr in MERGED]
    named += [node.arg for node in ast.walk(merge) if isinstance(node, ast.keyword) and node.arg in MERGED]
    assert not named, named


@pytest.mark.parametrize("name", [n for n in MERGED if example(RUN_TYPES[n], 0).__class__ in (int, float)])
def test_a_number_the_ranks_merge_reaches_a_report_column(name):
    """From two ranks' records to report.csv: the row's column holds the run's merged figure (one run: its
    value), with no line about it in the runner or the rows."""
    low, high = example(RUN_TYPES[name], 0), example(RUN_TYPES[name], 1)
    record = dataclasses.replace(merged_over(two_ranks({name: (low, high)})), status="ok")
    header, body = csv_table(row_set([(Path("sweep/0/results.json"), record)]).rows)
    columns = [column for column, value in zip(header, body[0], strict=True) if value == getattr(record, name)]
    assert columns, f"{name} ({getattr(record, name)}) is in no column of report.csv"
