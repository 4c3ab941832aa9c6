"""harness/rank/gpt.py: a causal language model of either shape, whose checkpointing changes memory, never the
numbers; and model=gpt through the CLI (tokens/s, FSDP2 per block, data=loader refused)."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO, describe, rank_spec, run_cli

from examples.tokens import write_tokens
from harness import cli
from harness.core.amp_levels import AmpConfig, resolve
from harness.core.inputs import loss, tokens
from harness.plan.trace import trace_step
from harness.rank.gpt import GPT
from harness.rank.worker import run_rank

SMALL = dict(layers=2, width=16, heads=2, vocab_size=32, seq_len=8)


@pytest.mark.parametrize("shape", ["gpt2", "llama"])
def test_logits_at_a_position_depend_on_earlier_tokens_only(shape):
    torch.manual_seed(0)
    model = GPT(**SMALL, shape=shape).eval()
    x = torch.randint(0, 32, (2, 8))
    later = x.clone()
    later[:, 5:] = (later[:, 5:] + 1) % 32
    out, out_later = model(x), model(later)
    assert out.shape == (2, 8, 32)
    torch.testing.assert_close(out[:, :5], out_later[:, :5])
    assert not torch.allclose(out[:, 5:], out_later[:, 5:])


def test_checkpointing_recomputes_the_same_gradients():
    x, y = torch.randint(0, 32, (4, 8)), torch.randint(0, 32, (4, 8))
    grads = []
    for checkpoint in (False, True):
        torch.manual_seed(0)
        model = GPT(**SMALL, checkpoint=checkpoint)
        loss(model(x), y).backward()
        grads.append([p.grad for p in model.parameters()])
    for plain, recomputed in zip(*grads, strict=True):
        torch.testing.assert_close(plain, recomputed)


@pytest.mark.parametrize(("options", "key"), [({"width": 18, "heads": 4}, "model.width"),
                                             ({"layers": 0}, "model.layers"), ({"shape": "bert"}, "model.shape")])
def test_a_shape_that_cannot_be_built_is_named(options, key):
    with pytest.raises(ValueError, match=key):
        GPT(**{**SMALL, **options})


def test_data_loader_is_refused_for_a_token_model(capsys):
    with pytest.raises(SystemExit) as info:
        cli.precheck(["model=gpt", "data=loader"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == cli.EXIT_BAD_INPUT and len(lines) == 1, lines
    assert lines[0].startswith("error: data=loader is not allowed: synthetic for model=gpt"), lines


@pytest.mark.slow
def test_checkpointing_lowers_the_measured_and_the_predicted_peak(tmp_path):
    """Measured on this machine (the live-tensor peak of a rank's first iterations, run here), not read from the config:
    4 blocks whose activations outweigh the parameters, kept whole or recomputed; and the planner's traced peak."""
    size = {"layers": 4, "seq_len": 128}
    measured, predicted = {}, {}
    for checkpoint in (False, True):
        model = {"_target_": "harness.rank.gpt.GPT", **size, "checkpoint": checkpoint}
        record = run_rank(rank_spec(tmp_path / str(checkpoint), model=model, batch_size=16, iterations=20,
                                    log_every=10))
        assert record.ok, record.error
        measured[checkpoint] = record.tensor_peak_mib
        predicted[checkpoint] = trace_step(model, tokens(128, 256), resolve(AmpConfig(level="O0"), "cpu"),
                                           {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.01}, 16).peak
    assert measured[True] < 0.6 * measured[False], measured  # 41 MiB -> 14 MiB here on the day it was written
    assert predicted[True] < 0.6 * predicted[False], predicted


@pytest.mark.slow
def test_model_gpt_trains_on_a_token_file_and_reports_tokens_per_second(tmp_path):
    """The README's text as bytes (examples/tokens.py), read every step: the loss falls, the wait is counted."""
    write_tokens([REPO / "README.md"], tmp_path / "tokens.bin")
    proc, results = run_cli("model=gpt", "strategy=single", "batch_size=8", "model.seq_len=16", "iterations=30",
                            "log_every=10", "data=tokens", f"data.file={tmp_path / 'tokens.bin'}", tmp_path=tmp_path)
    assert proc.returncode == 0 and results["status"] == "ok", describe(proc)
    assert results["sample"] == "tokens" and results["tokens_per_sample"] == 16
    assert results["throughput_tokens_s"] == pytest.approx(results["throughput_img_s"] * 16)  # sequences x 16
    assert "tokens/s" in proc.stdout
    windows = results["windows"]
    assert windows[-1]["loss"] < windows[0]["loss"] - 0.5  # 5.6 -> 4.7 here: English bytes are learnt
    assert all(w["data_wait_s"] > 0 for w in windows)
