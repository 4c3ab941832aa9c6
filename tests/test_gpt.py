"""harness/rank/gpt.py: a causal language model of either shape, whose checkpointing changes memory, never the
numbers; and model=gpt through the CLI (tokens/s, FSDP2 per block, data=loader refused)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import REPO, describe, rank_spec, run_cli, run_sweep

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


# layers=2, width=32, heads=2, vocab_size=64, seq_len=16 (GPT-2 shape), worked by hand:
# token embedding 64*32 = 2048, positions 16*32 = 512, final norm 2*32 = 64, head 32*64 = 2048; per block:
# two norms 2*2*32 = 128, qkv 32*96+96 = 3168, out 32*32+32 = 1056, up 32*128+128 = 4224, down 128*32+32 = 4128
# = 12704; two blocks 25408. Together 30080 fp32 parameters = 120320 bytes.
GPT_SWEPT = ("model=gpt", "model.layers=2", "model.width=32", "model.heads=2", "model.vocab_size=64",
             "model.seq_len=16")
GPT_PARAM_BYTES = 30080 * 4


def test_the_hand_count_of_the_swept_gpt():
    options = {k.split(".")[1]: int(v) for k, v in (a.split("=") for a in GPT_SWEPT[1:])}
    assert sum(p.numel() for p in GPT(**options).parameters()) * 4 == GPT_PARAM_BYTES


@pytest.mark.slow
def test_fsdp_shards_the_gpt_per_block_holds_half_on_each_rank_and_trains_what_one_process_trains(tmp_path):
    """One sweep, one device against FSDP2 on two: each FSDP2 rank holds half the parameters (measured: the bytes
    its parameters hold once sharded; predicted: the planner's per-rank parameters), and the transformer's update
    agrees with one device's within float32 rounding (parity, strict: no batch-norm, dropout 0)."""
    from harness.parity import report as verdicts
    from harness.report import build_report

    sweep = tmp_path / "sweep"
    proc = run_sweep("strategy=single,fsdp", "nprocs=2", *GPT_SWEPT, "batch_size=8", "parity=true", "iterations=20",
                     "log_every=10", "plan.predict=true", sweep_dir=sweep)
    assert proc.returncode == 0, describe(proc)
    results = {r["strategy"]: r for r in map(json.loads, (p.read_text() for p in sweep.glob("*/results.json")))}
    mib = 2**20
    for strategy, ranks, share in (("single", 1, 1), ("fsdp", 2, 2)):
        record = results[strategy]
        assert record["status"] == "ok", record["error"]
        held = [r["params_held_mib"] * mib for r in record["ranks"]]
        assert held == pytest.approx([GPT_PARAM_BYTES / share] * ranks, rel=1e-6), (strategy, held)
        predicted = [r["params_mib"] * mib for r in record["prediction"]["memory"]]
        assert predicted == pytest.approx([GPT_PARAM_BYTES / share] * ranks, abs=0.01 * mib), (strategy, predicted)
    assert results["fsdp"]["config"]["strategy"]["blocks"] is None  # the model named its blocks itself
    report = build_report([sweep], tmp_path / "report", quiet=True)
    fsdp = next(r for r in report.rows if r.label.startswith("fsdp"))
    assert (fsdp.parity, fsdp.parity_reference) == (verdicts.AGREES, "single O0"), fsdp.parity_note
    assert fsdp.params_rank_mib * mib == pytest.approx(GPT_PARAM_BYTES / 2, rel=1e-6)  # the memory table's figure
    assert "params/rank MiB" in (tmp_path / "report" / "report.md").read_text()


def test_fsdp_compiles_each_named_block_on_its_own_and_anything_else_whole():
    """What torch.compile is given, not a compilation (that happens at the first call): a GPT's blocks each get a
    compiled forward of their own, called by the block's __call__ between FSDP2's hooks; a model naming no
    blocks is wrapped whole."""
    from strategies.fsdp import FSDP2

    model = GPT(**SMALL)
    compiled = FSDP2().compile(model)
    assert compiled is model
    for block in model.blocks:
        assert "forward" in vars(block) and hasattr(block.forward, "_torchdynamo_orig_callable")
    assert "forward" not in vars(model)  # the root (embedding, head) stays eager
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    assert isinstance(FSDP2().compile(cnn), torch._dynamo.eval_frame.OptimizedModule)
