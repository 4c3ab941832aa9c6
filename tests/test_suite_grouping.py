"""The README's test command relies on pytest-xdist sending each `xdist_group` to one worker: the SLURM,
report page, parity and profile tests share one expensive fixture each. Some pytest/xdist pairs silently stop
grouping (pytest 9.2 with pytest-xdist 3.8, pytest-xdist issue #1386); the suite then runs every shared
fixture once per worker and takes minutes longer while still passing. This catches that pairing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = '''
import os
import pytest

@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    with open(os.environ["GROUP_LOG"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("i", range(8))
def test_spread(i):
    pass
'''


@pytest.mark.slow
def test_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(TESTS)
    log = tmp_path / "workers.log"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "GROUP_LOG": str(log)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers = log.read_text().split()
    assert len(workers) == 4
    assert len(set(workers)) == 1, f"the group ran on {sorted(set(workers))}: install what pyproject.toml allows"
