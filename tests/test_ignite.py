"""strategy=ignite: runs on CPU when pytorch-ignite is installed; a clear error or a `skipped` row when not."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, TINY, describe, run_cli

from harness.compose import compose_one, hydra_context
from harness.launch.decide import plan_from_dict
from harness.launch.runner import Unavailable, execute
from strategies.ignite import INSTALL_HINT, IgniteStrategy

ignite_installed = pytest.mark.skipif(IgniteStrategy.unavailable_reason() is not None,
                                      reason="pytorch-ignite is not installed")


@pytest.fixture
def ignite_hidden(monkeypatch):
    """As if pytorch-ignite were not installed: `import ignite` fails, find_spec finds nothing."""
    for name in [m for m in sys.modules if m == "ignite" or m.startswith("ignite.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ignite", None)


def ignite_config(**overrides: str) -> dict:
    with hydra_context():
        return compose_one(["strategy=ignite", "nprocs=2", *TINY, "iterations=40", "log_every=20",
                            *[f"{k}={v}" for k, v in overrides.items()]]).config


def test_unavailable_reason_when_missing(ignite_hidden):
    assert IgniteStrategy.unavailable_reason() == INSTALL_HINT
    assert "pip install -e '.[ignite]'" in INSTALL_HINT


@ignite_installed
def test_available_when_installed():
    assert IgniteStrategy.unavailable_reason() is None


def test_single_run_refused_when_missing(ignite_hidden, tmp_path):
    with pytest.raises(Unavailable, match="needs pytorch-ignite"):
        execute(plan_from_dict(ignite_config(), "ignite", in_sweep=False), tmp_path / "run", in_sweep=False)
    assert not (tmp_path / "run" / "results.json").exists()


def test_sweep_records_skipped_when_missing(ignite_hidden, tmp_path):
    results = execute(plan_from_dict(ignite_config(), "ignite", in_sweep=True), tmp_path / "run", in_sweep=True)
    assert results.status == "skipped"
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert written["status"] == "skipped" and written["strategy"] == "ignite"
    assert INSTALL_HINT in written["error"]


@pytest.mark.slow
def test_cli_error_when_missing(tmp_path):
    """The real CLI, with ignite made unimportable in the child: one error line, exit 2."""
    code = ("import sys, runpy; sys.modules['ignite'] = None; sys.argv = ['run.py', *sys.argv[1:]]; "
            "runpy.run_path('run.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code, "strategy=ignite", *TINY,
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip().splitlines()[-1] == f"error: {INSTALL_HINT}", describe(proc)


@pytest.mark.slow
@ignite_installed
def test_cli_ignite_runs_on_cpu(tmp_path):
    proc, results = run_cli("strategy=ignite", "nprocs=2", *TINY, "iterations=40", tmp_path=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert results is not None and results["status"] == "ok", describe(proc)
    assert results["strategy"] == "ignite" and results["world_size"] == 2
    assert len({r["pid"] for r in results["ranks"]}) == 2
    assert results["throughput_img_s"] and results["memory"]["per_process"]
