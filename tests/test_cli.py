"""The CLI's refusals: bad input is exit code 2 and one line on stderr, before any folder or worker exists."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, TINY, describe, run_cli
from omegaconf import OmegaConf

from harness import cli
from harness.config import AMP_LEVELS

# DDP, so that a wrongly started run would show "[ddp ..." progress lines and rank records.
DDP = ("strategy=ddp", "nprocs=2", *TINY, "iterations=20", "log_every=10")


def assert_refused(proc, tmp_path, *words: str) -> str:
    assert proc.returncode == cli.EXIT_BAD_INPUT, describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, describe(proc)
    line = lines[0]
    assert line.startswith("error: ")
    for word in words:
        assert word in line, (word, line)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "[ddp" not in proc.stdout  # no worker trained
    run_dir = tmp_path / "run"
    assert not run_dir.exists(), sorted(p.name for p in run_dir.rglob("*"))  # no results, no empty run folder
    return line


@pytest.mark.slow
def test_unknown_amp_level(tmp_path):
    proc, results = run_cli(*DDP, "amp=O4", tmp_path=tmp_path)
    assert results is None
    line = assert_refused(proc, tmp_path, "amp=O4", *AMP_LEVELS)
    assert "amp" in line.split("=")[0]


@pytest.mark.slow
def test_bad_amp_dtype(tmp_path):
    proc, results = run_cli(*DDP, "amp=O2", "amp.dtype=int8", tmp_path=tmp_path)
    assert results is None
    assert_refused(proc, tmp_path, "amp.dtype=int8", "float16", "bfloat16")


@pytest.mark.slow
def test_apex_without_apex_or_cuda(tmp_path):
    proc, results = run_cli(*DDP, "amp=O1", "amp.impl=apex", tmp_path=tmp_path)
    assert results is None
    assert_refused(proc, tmp_path, "apex")


@pytest.mark.slow
def test_batch_not_divisible_by_the_workers(tmp_path):
    proc, results = run_cli("strategy=ddp", "nprocs=2", "model=tiny_cnn", "data.image_size=8", "batch_size=7",
                            "iterations=20", "log_every=10", tmp_path=tmp_path)
    assert results is None
    assert_refused(proc, tmp_path, "batch_size=7", "multiple of the 2 workers", "6", "8")


def test_precheck_refuses_unknown_strategy(capsys):
    with pytest.raises(SystemExit) as info:
        cli.precheck(["strategy=nope", "amp=O1"])
    assert info.value.code == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "strategy=nope" in err[0] and "ddp" in err[0] and "single" in err[0]


def test_precheck_lets_good_overrides_and_flags_through(capsys):
    cli.precheck(["-m", "strategy=single,ddp", "amp=O0,O1", "batch_size=8", "--multirun"])
    assert capsys.readouterr().err == ""


def test_hw_resolver_picks_the_cpu_value_without_a_gpu():
    cli.register_resolvers()
    cli.register_resolvers()  # idempotent
    cfg = OmegaConf.create({"size": "${hw:224,32}", "model": "${hw:resnet101,resnet18}"})
    gpu = cli.has_gpu()
    assert (cfg.size, cfg.model) == ((224, "resnet101") if gpu else (32, "resnet18"))


def test_cpu_defaults_note_names_only_defaults_left_to_the_machine():
    cli.register_resolvers()
    cfg = OmegaConf.create({"model": {"name": "${hw:resnet101,resnet18}"}, "data": {"image_size": 8},
                            "batch_size": "${hw:128,32}"})
    note = cli.cpu_defaults_note(cfg)
    if cli.has_gpu():
        assert note is None
    else:
        assert "model.name=resnet18" in note and "batch_size=32" in note and "image_size" not in note
        assert cli.cpu_defaults_note(OmegaConf.create({"model": {"name": "tiny_cnn"}, "data": {"image_size": 8},
                                                       "batch_size": 8})) is None


def test_occupied_run_folder_is_refused_before_hydra_touches_it(tmp_path):
    occupied = tmp_path / "old_run"
    (occupied / ".hydra").mkdir(parents=True)
    (occupied / "results.json").write_text('{"schema": 1, "status": "ok"}')
    (occupied / ".hydra" / "config.yaml").write_text("sentinel")
    before = {p: p.stat().st_mtime_ns for p in occupied.rglob("*")}
    proc = subprocess.run([sys.executable, "run.py", "model=tiny_cnn", f"hydra.run.dir={occupied}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "hydra.run.dir" in lines[0] and "results.json" in lines[0]
    assert {p: p.stat().st_mtime_ns for p in occupied.rglob("*")} == before
    assert (occupied / ".hydra" / "config.yaml").read_text() == "sentinel"
