"""bench/mutants.py (benchmark 17) stays current: every mutant's text is in the code exactly once."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_no_mutant_is_stale(monkeypatch):
    spec = importlib.util.spec_from_file_location("mutants", REPO / "bench" / "mutants.py")
    assert spec is not None and spec.loader is not None
    mutants = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "mutants", mutants)  # dataclasses look their module up
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # its `import common`
    spec.loader.exec_module(mutants)
    stale = [m.name for m in mutants.MUTANTS if mutants.stale(m)]
    assert not stale, f"update bench/mutants.py with the code: {stale}"
    invalid = [m.name for m in mutants.MUTANTS if not mutants.compiles(m)]
    assert not invalid, f"mutants that do not compile (a test would fail on the syntax, not the figure): {invalid}"
    assert len({m.name for m in mutants.MUTANTS}) == len(mutants.MUTANTS)
