"""The import contract (pyproject.toml's [tool.importlinter], run by .ci/run): the real tree keeps it, and an
import upward through the layers, or between two features, breaks it and is named."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([*LINT, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_the_tree_keeps_the_contract():
    proc = lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize("module, upward", [
    ("harness/core/errors.py", "harness.launch.runner"),  # the bottom layer reaching the parent's side
    ("amp/base.py", "strategies.base"),  # amp below strategies
    ("harness/memory/imbalance.py", "harness.parity.report"),  # one feature into another
    ("harness/rank/trainer.py", "harness.launch.launcher"),  # the rank's side into the parent's
])
@pytest.mark.slow
def test_an_import_against_the_layers_breaks_the_contract(tmp_path, module, upward):
    for package in ("harness", "strategies", "amp"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\nimport {upward}  # noqa: E402\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0
    importer = module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {upward}" in proc.stdout, proc.stdout
