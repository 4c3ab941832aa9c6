"""The plan table's units (harness.planning.tables): a token model's rate in tokens/s, small rates not rounded away."""

from __future__ import annotations

from typing import Any

import pytest

from harness.planning import tables


def row(unit: str, tokens: int | None, samples_s: float, band: tuple[float, float]) -> dict[str, Any]:
    memory = {"params_mib": 100.0, "grads_mib": 100.0, "optimizer_mib": 200.0, "activations_mib": 1000.0,
              "inputs_mib": 1.0, "comm_buffers_mib": 50.0, "allocator_mib": 145.0, "peak_mib": 1596.0}
    prediction = {"hardware": "a100x8", "world_size": 8, "peak_mib": 1596.0, "device_memory_mib": 81920.0,
                  "memory": [memory], "fits": True, "s_per_iteration": 640 / samples_s,
                  "throughput_img_s": samples_s, "throughput_band": band, "band_source": "leave-one-out",
                  "assumptions": [], "time": {"compute_s": 1.0, "optimizer_s": 0.1, "comm_s": 0.2,
                                              "exposed_comm_s": 0.05, "overlapped_comm_s": 0.15}}
    return {"status": "predicted", "strategy": "fsdp", "amp": "O1", "variant": "", "hardware": "a100x8",
            "reason": None, "prediction": prediction, "tokens_per_sample": tokens, "unit": unit}


def test_a_token_models_rate_is_its_samples_times_the_sequences_tokens():
    """69.74 sequences/s of 2,048 tokens: 142,828 tokens/s, its band 0.83-1.21x alike (57.88 and 84.39 sequences/s:
    118,538 and 172,831)."""
    text = tables([row("tokens/s", 2048, 69.74, (57.88, 84.39))])
    line = next(line for line in text.splitlines() if "142,828 tokens/s" in line)
    assert "118,538–172,831" in line


def test_a_slow_image_rate_keeps_three_figures():
    """A 70B model's 0.412 samples/s stays 0.412, never `0` or `1` (its band too)."""
    text = tables([row("img/s", None, 0.412, (0.342, 0.498))])
    assert "0.412 img/s" in text and "0.342–0.498" in text


def test_a_row_is_read_once_into_its_record_and_written_back_as_it_came():
    """plan.json's row (harness.core.results.PlanRow): the keys predict_on and plan=true gave it, in their order; a
    row that was not predicted has no devices nor prediction."""
    from harness.core.results import PlanRow, SchemaError

    given = {**row("img/s", None, 0.412, (0.342, 0.498)), "world_size": 8, "overrides": ["strategy=fsdp"],
             "seconds": 1.5}
    typed = PlanRow.from_json(given)
    assert typed.prediction is not None and typed.prediction.throughput_img_s == 0.412
    assert typed.label == "fsdp O1" and typed.to_json()["prediction"]["throughput_band"] == [0.342, 0.498]
    skipped = {"strategy": "dp", "amp": "O0", "model": "tiny_cnn", "variant": "", "hardware": "h100x8",
               "global_batch": 64, "status": "skipped", "reason": "needs CUDA", "overrides": ["strategy=dp"],
               "tokens_per_sample": None, "unit": "img/s", "seconds": 0.01}
    assert list(PlanRow.from_json(skipped).to_json().items()) == list(skipped.items())
    with pytest.raises(SchemaError, match="plan.json: bogus"):
        PlanRow.from_json({**skipped, "bogus": 1})
