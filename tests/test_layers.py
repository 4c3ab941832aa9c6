"""The import contract (pyproject.toml's [tool.importlinter], run by .ci/run): the real tree keeps it, and an
import upward through the layers, or between two features, breaks it and is named, in annotations too
(`if TYPE_CHECKING:` imports count); and no two modules import each other, however late or guarded."""

from __future__ import annotations

import ast
import os
import re
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


@pytest.mark.slow
def test_an_import_only_for_annotations_breaks_the_contract_too(tmp_path):
    """A feature naming the report's Row under `if TYPE_CHECKING:` is an import upward all the same."""
    for package in ("harness", "strategies", "amp"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "harness/memory/report.py"
    target.write_text(target.read_text() + "\nfrom typing import TYPE_CHECKING  # noqa: E402\n\nif TYPE_CHECKING:\n"
                      "    from harness.report.rows import Row  # noqa: F401\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0
    assert "harness.memory.report -> harness.report.rows" in proc.stdout, proc.stdout


def test_the_contract_counts_imports_made_only_for_annotations():
    text = (REPO / "pyproject.toml").read_text()
    assert re.search(r"^exclude_type_checking_imports = false\b", text, re.MULTILINE), "imports for annotations count"


def project_imports() -> dict[str, set[str]]:
    """Every project module -> the project modules it imports anywhere in its text: at the top, inside a function,
    under `if TYPE_CHECKING:` (an import of a name inside a module counts as one of the module)."""
    modules = {}
    for package in ("harness", "strategies", "amp"):
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def module_of(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = found.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    above = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*above, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            imported |= {m for t in targets if (m := module_of(t)) is not None and m != name}
    return found


def test_no_two_modules_import_each_other_even_for_annotations_or_late():
    imports = project_imports()
    assert "harness.report.findings" in imports["harness.report.outputs"]  # an import at the top is seen
    assert "harness.report.projection" in imports["harness.report.findings"]  # and one inside a function
    pairs = sorted(f"{a} <-> {b}" for a, found in imports.items() for b in found if a < b and a in imports.get(b, ()))
    assert not pairs, pairs
