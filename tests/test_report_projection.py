"""harness.report.projection: a run measured here is projected as it would run on the preset's GPUs."""

from __future__ import annotations

from conftest import run_config

from harness.report.projection import _as_on_a_gpu


def test_a_cpu_runs_kernel_defaults_become_the_gpus_unless_typed():
    measured_here = run_config("ddp")
    assert measured_here.kernels.channels_last is False  # this machine's default, recorded by the run
    assert _as_on_a_gpu(measured_here, ["strategy=ddp"]).kernels.channels_last is True
    assert _as_on_a_gpu(measured_here, ["kernels.channels_last=false"]).kernels.channels_last is False
    assert _as_on_a_gpu(measured_here, []).kernels.matmul_precision == "highest"  # no GPU default of its own
