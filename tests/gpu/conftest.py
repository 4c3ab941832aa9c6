"""The GPU tests' own settings: this machine's figures measured, as in a user's run."""

from __future__ import annotations

import os
from collections.abc import Iterable

import pytest

# tests/conftest.py's fixed figures of a machine (float16 at 0.01 TFLOP/s for every "cuda:N" key) and its
# in-process calibration: for the CPU suite's speed. On the H200 they reached the GPU tests' runs through the
# environment, and a GPT's MFU came out as 877.7 (its FLOPs over that peak).
CPU_SUITE_SETTINGS = ("HARNESS_MACHINE_CACHE", "HARNESS_PLAN_CALIBRATION")


@pytest.fixture(scope="session", autouse=True)
def fixed_machine_figures() -> Iterable[None]:
    """Overrides tests/conftest.py's fixture of the same name for the tests in this folder: nothing fixed, the
    GPU's rates measured and kept in the user's cache. Runs are still predicted only where a test asks
    (plan.predict=true): each prediction costs a calibration on the GPU."""
    previous = {key: os.environ.pop(key, None) for key in CPU_SUITE_SETTINGS}
    yield
    os.environ.update({key: value for key, value in previous.items() if value is not None})
