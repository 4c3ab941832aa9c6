"""harness.core.results: the results file contract (checked on real runs), atomic writes, no overwrites."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import DDP_RUN, SINGLE_RUN

from harness.core import results as results_mod
from harness.core.results import (
    PHASES,
    SCHEMA,
    STATUSES,
    environment,
    load_results,
    write_json_atomic,
    write_results,
)

NUMBER = (int, float)


def check_contract(r: dict) -> None:
    """Every key a reader (report, users) relies on, with its type."""
    assert isinstance(r["schema"], int) and not isinstance(r["schema"], bool) and r["schema"] == SCHEMA
    assert r["status"] in STATUSES
    assert r["error"] is None or isinstance(r["error"], str)
    for key in ("strategy", "amp", "model"):
        assert isinstance(r[key], str) and r[key]
    assert isinstance(r["devices"], list) and all(isinstance(d, str) for d in r["devices"])
    for key in ("world_size", "global_batch", "iterations", "log_every"):
        assert isinstance(r[key], int) and r[key] >= 1, key

    assert isinstance(r["windows"], list)
    for w in r["windows"]:
        assert set(w) >= {"end_iter", "seconds", "cumulative_seconds", "warmup", "loss"}
        assert isinstance(w["end_iter"], int) and isinstance(w["warmup"], bool)
        assert isinstance(w["seconds"], NUMBER) and isinstance(w["cumulative_seconds"], NUMBER)
        assert w["loss"] is None or isinstance(w["loss"], NUMBER)
    assert isinstance(r["per_rank_windows"], dict)
    for rank, ws in r["per_rank_windows"].items():
        assert rank.isdigit() and isinstance(ws, list)
        for w in ws:
            assert set(w) >= {"end_iter", "seconds", "cumulative_seconds", "warmup", "loss"}
    assert r["throughput_img_s"] is None or isinstance(r["throughput_img_s"], NUMBER)

    memory = r["memory"]
    assert memory["source"] in ("nvml", "psutil", "torch-allocator", None)
    for d in memory["per_device"]:
        assert set(d) >= {"device", "peak_mib", "baseline_mib"}
        assert isinstance(d["device"], str)
        assert isinstance(d["peak_mib"], NUMBER) and isinstance(d["baseline_mib"], NUMBER)
    for p in memory["per_process"]:
        assert set(p) >= {"pid", "rank", "device", "peak_mib"}
        assert isinstance(p["pid"], int) and (p["rank"] is None or isinstance(p["rank"], int))
        assert isinstance(p["device"], str)
        assert p["peak_mib"] is None or isinstance(p["peak_mib"], NUMBER)  # None: the driver hides it

    env = r["env"]
    assert set(env) >= {"torch", "torch_built_for_cuda", "cuda_available", "driver", "gpu_names", "hostname",
                        "python", "command"}
    assert isinstance(env["cuda_available"], bool)
    assert isinstance(env["torch"], str) and isinstance(env["python"], str) and isinstance(env["hostname"], str)
    assert isinstance(env["gpu_names"], list)
    assert "run.py" in env["command"]

    assert isinstance(r["config"], dict) and r["config"]["strategy"]["_target_"].startswith("strategies.")
    assert set(r["precision"]) >= {"level", "impl", "dtype", "master_weights", "keep_batchnorm_fp32",
                                   "loss_scale", "final_loss_scale", "skipped_steps"}
    assert r["precision"]["level"] == r["amp"]


@pytest.mark.slow
@pytest.mark.parametrize("run", [DDP_RUN, SINGLE_RUN], ids=["ddp", "single"])
def test_real_results_file_matches_the_contract(cli_run, run):
    proc, results = cli_run(*run)
    assert proc.returncode == 0
    check_contract(results)
    assert results["status"] == "ok" and results["error"] is None
    assert results["memory"]["source"] == "psutil"
    assert results["env"]["driver"] is None and results["env"]["gpu_names"] == []  # CPU machine
    assert results["env"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert results["precision"] == {**results["precision"], "level": "O0", "impl": "native", "dtype": "float32",
                                    "master_weights": False, "skipped_steps": 0}
    config = results["config"]
    assert (config["batch_size"], config["iterations"], config["log_every"]) == \
        (results["global_batch"], results["iterations"], results["log_every"])
    assert json.dumps(results)  # round-trips
    # where the run's time went: every phase in order, none negative, together within the run's wall time, and
    # the loop at least as long as its windows (the launcher's clock against the ranks')
    phases = results["phases"]
    assert list(phases) == [p for p in PHASES if p in phases] and min(phases.values()) >= 0
    assert sum(phases.values()) <= results["finished_at"] - results["started_at"] + 0.05
    assert phases["windows"] >= sum(w["seconds"] for w in results["windows"]) - 0.01
    assert results["machine"]["cores"] >= 1 and results["machine"]["windows_s"] > 0 and results["round"] is None
    undocumented = {k for k in results if not k.startswith("_")} - documented_fields()
    assert not undocumented, f"results.json fields missing from docs/results.md's table: {sorted(undocumented)}"


def documented_fields() -> set[str]:
    """The field names in the first column of docs/results.md's table."""
    readme = (Path(__file__).resolve().parent.parent / "docs" / "results.md").read_text()
    section = readme[readme.index("## Fields"):]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([a-z_]+)`", line.split(" | ")[0]))
    return names


def minimal(status: str = "ok") -> dict:
    return {"schema": SCHEMA, "status": status, "error": None, "strategy": "single", "amp": "O0", "model": "tiny"}


def test_write_json_atomic_leaves_only_the_file(tmp_path):
    path = tmp_path / "deep" / "results.json"
    write_json_atomic(path, {"a": 1, "when": tmp_path})  # default=str for paths and the like
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]
    assert json.loads(path.read_text()) == {"a": 1, "when": str(tmp_path)}
    write_json_atomic(path, {"a": 2})
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]
    assert json.loads(path.read_text()) == {"a": 2}


def test_write_json_atomic_failure_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    write_json_atomic(path, {"old": True})

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(results_mod.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_json_atomic(path, {"new": True})
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
    assert json.loads(path.read_text()) == {"old": True}


def test_write_results_refuses_to_overwrite(tmp_path):
    path = write_results(tmp_path, {**minimal(), "error": "the first"})
    assert path == tmp_path / "results.json"
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        write_results(tmp_path, {**minimal(), "error": "the second"})
    assert load_results(path).error == "the first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_write_results_rejects_an_unknown_status(tmp_path):
    with pytest.raises(ValueError, match="great"):
        write_results(tmp_path, minimal(status="great"))
    assert not (tmp_path / "results.json").exists()


def test_load_results_rejects_other_json(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": "world"}))
    with pytest.raises(ValueError, match="not a results file"):
        load_results(other)
    other.write_text("[1, 2]")
    with pytest.raises(ValueError):
        load_results(other)


def test_environment_has_the_contract_keys_and_takes_extras():
    env = environment({"driver": "550.54.15", "gpu_names": ["NVIDIA H100"]})
    assert env["driver"] == "550.54.15" and env["gpu_names"] == ["NVIDIA H100"]
    assert env["hostname"] and env["torch"] and env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert os.path.basename(sys.executable) in env["command"]
    assert environment()["driver"] is None and environment()["gpu_names"] == []


# ---- typed records: one definition, a not-run record as complete as a run's, old files, the shipped schema ----

OLD_NOT_RUN = {  # schema 1's record of a refused combination (harness/cli.py before the typed records): 22 keys
    "schema": 1, "status": "skipped", "error": "strategy=dp: needs CUDA GPUs; this machine has none (ran nothing)",
    "strategy": "dp", "amp": "O1", "model": "resnet18", "devices": [], "world_size": None, "nodes": 1,
    "global_batch": 32, "iterations": 60, "iterations_requested": 60, "log_every": 20, "windows": [],
    "per_rank_windows": {}, "throughput_img_s": None,
    "memory": {"source": None, "per_device": [], "per_process": []}, "overrides": ["strategy=dp", "amp=O1"],
    "config": {"batch_size": 32}, "strategy_options": {}, "variant": "", "compile": False, "grad_accum": 1,
}


def test_a_not_run_record_has_every_key_a_run_has():
    from harness.core.results import RunRecord

    record = RunRecord.not_run(status="skipped", error="needs CUDA", strategy="dp", amp="O0", model="resnet18")
    written = record.to_dict()
    ran = RunRecord(schema=SCHEMA, status="ok", strategy="ddp", amp="O0", model="resnet18").to_dict()
    assert set(written) == set(ran) and len(written) >= 48
    assert written["schema"] == SCHEMA and written["status"] == "skipped" and written["error"] == "needs CUDA"
    assert written["windows"] == [] and written["throughput_img_s"] is None and written["precision"] is None
    assert written["memory"] == {"source": None, "samples": None, "per_device": [], "per_process": [],
                                 "warning": None}


def test_a_schema_1_record_loads_with_defaults_for_what_it_lacks(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(OLD_NOT_RUN))
    record = load_results(path)
    assert record.schema == 1 and record.status == "skipped" and record.strategy == "dp"
    assert record.precision is None and record.ranks == [] and record.memory.per_device == []
    assert record.env.torch is None and record.profile is None and record.started_at is None


def test_a_schema_this_harness_does_not_read_is_refused_in_one_line_naming_the_versions(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({**OLD_NOT_RUN, "schema": 7}))
    with pytest.raises(ValueError) as caught:
        load_results(path)
    assert str(caught.value) == "results.json schema 7 is not one this harness reads (1, 2)"


@pytest.mark.parametrize("change, where", [
    ({"throughput_img_s": "fast"}, "throughput_img_s"),
    ({"windows": [{"end_iter": 20, "seconds": 1.0, "warmup": False}]}, "windows.0.cumulative_seconds"),
    ({"memory": {"per_device": [{"device": "cpu:0", "peak": 1.0}]}}, "memory.per_device.0.peak"),
    ({"bogus": 1}, "bogus"),
    ({"status": "great"}, "status"),
])
def test_a_key_or_type_outside_the_records_is_refused_naming_where(tmp_path, change, where):
    with pytest.raises(ValueError) as caught:
        write_results(tmp_path, {**minimal(), **change})
    assert str(caught.value).startswith(f"results.json: {where}: ")
    assert not (tmp_path / "results.json").exists()


def test_the_shipped_schema_is_the_one_the_records_generate():
    from harness.core import results_schema

    assert results_schema.SCHEMA_PATH.read_text() == results_schema.text(), \
        "harness/core/results.schema.json is stale: run python -m harness.core.results_schema"


def test_the_shipped_schema_accepts_a_written_record_and_rejects_incomplete_or_mistyped_ones():
    import jsonschema

    from harness.core.results import RunRecord
    from harness.core.results_schema import SCHEMA_PATH

    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    written = RunRecord.not_run(status="failed", error="lost", strategy="ddp", amp="O2", model="m").to_dict()
    assert not list(validator.iter_errors(written))
    missing = {k: v for k, v in written.items() if k != "throughput_img_s"}
    assert [e.message for e in validator.iter_errors(missing)] == ["'throughput_img_s' is a required property"]
    mistyped = {**written, "world_size": "two"}
    assert len(list(validator.iter_errors(mistyped))) == 1
    assert list(validator.iter_errors(OLD_NOT_RUN))  # schema 1: loads (above), but is not what is written now


def test_the_shipped_schema_is_valid_and_validates_the_way_a_user_calls_it():
    """`jsonschema.validate(record, schema)`, as a user calls it, checks the schema against its metaschema
    first: an $id with a fragment (`...#v2`) once made it raise SchemaError before looking at the record."""
    import jsonschema

    from harness.core.results import RunRecord
    from harness.core.results_schema import SCHEMA_PATH

    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    written = RunRecord.not_run(status="failed", error="lost", strategy="ddp", amp="O2", model="m").to_dict()
    jsonschema.validate(written, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**written, "world_size": "two"}, schema)


def test_docs_results_page_names_every_top_level_field_once():
    """docs/results.md's field table and the records agree: a field added to RunRecord must be documented."""
    from dataclasses import fields

    from harness.core.results import RunRecord

    page = (Path(__file__).resolve().parent.parent / "docs" / "results.md").read_text()
    table = page[page.index("| field | meaning |"):]
    documented = re.findall(r"`(\w+)`", "\n".join(line.split("|")[1] for line in table.splitlines()[2:]
                                                 if line.startswith("|")))
    assert sorted(documented) == sorted(f.name for f in fields(RunRecord))
