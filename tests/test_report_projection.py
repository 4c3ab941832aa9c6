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


def test_a_language_model_s_projection_reads_in_tokens():
    """10 sequences/s of 2,048 tokens: 20,480 tokens/s, its band likewise; MFU as a share."""
    from harness.report.projection import _cells

    row = {"label": "fsdp O2", "hardware": "h100x8", "devices": 8, "global_batch": 64, "status": "predicted",
           "throughput_img_s": 10.0, "throughput_band": [8.0, 12.5], "mfu": 0.4123, "peak_mib": 1000.0, "fits": True,
           "unit": "tokens/s", "per_sample": 2048}
    cells = _cells(row)
    assert cells[4] == "20,480 tokens/s" and cells[5] == "16,384–25,600" and cells[6] == "41.2 %"
    assert _cells({**row, "unit": "img/s", "per_sample": 1})[4] == "10 img/s"
