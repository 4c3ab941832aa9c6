"""harness/rank/gpt.py: a causal language model of either shape, whose checkpointing (full or selective) and chunked
loss change memory, never the numbers; grouped-query attention; the named sizes of conf/model/ counted by hand against
their published parameter counts; and model=gpt through the CLI (tokens/s, FSDP2 per block, data=loader refused)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import CONF_DIR, REPO, describe, rank_spec, run_cli, run_sweep
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

from examples.tokens import write_tokens
from harness import cli
from harness.core.amp_levels import AmpConfig, resolve
from harness.core.errors import ConfigError
from harness.core.inputs import loss, loss_for, tokens
from harness.prediction.trace import trace_step
from harness.rank import gpt
from harness.rank.gpt import GPT, checkpoint_mode, swiglu_hidden
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


def _loss_and_gradients(model: GPT, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    value = loss_for(model)(model(x), y)
    value.backward()
    return value.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("shape", ["gpt2", "llama"])
def test_checkpointing_full_or_selective_recomputes_the_same_loss_and_gradients(shape):
    x, y = torch.randint(0, 32, (4, 8)), torch.randint(0, 32, (4, 8))
    results = {}
    for checkpoint in (False, True, "none", "full", "selective"):
        torch.manual_seed(0)
        results[checkpoint] = _loss_and_gradients(GPT(**SMALL, shape=shape, kv_heads=1, checkpoint=checkpoint), x, y)
    plain_loss, plain_grads = results[False]
    for checkpoint, (value, grads) in results.items():
        torch.testing.assert_close(value, plain_loss, msg=str(checkpoint))
        for plain, recomputed in zip(plain_grads, grads, strict=True):
            torch.testing.assert_close(recomputed, plain, msg=str(checkpoint))


class _Ops(TorchDispatchMode):
    """The operators that run, counted by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.counts[func.__name__] = self.counts.get(func.__name__, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("checkpoint", "products", "attention"), [("none", 0, 0), ("full", 3, 1), ("selective", 1, 0)])
def test_selective_checkpointing_recomputes_every_second_matrix_product_and_no_attention(checkpoint, products, attention):
    """Per block, the forward's matrix products that run again in backward: none without checkpointing; with full,
    qkv, out and up (down's output is needed by nothing backward keeps, and non-reentrant checkpointing stops
    recomputing once it has what backward needs); with selective (torchtitan's op policy: the 1st and 3rd products
    kept, every second one recomputed), out alone, and the attention kernel's output is kept. The GPT-2 shape's
    Linears have biases: their forward is addmm, which backward itself never runs."""
    model = GPT(**SMALL, checkpoint=checkpoint)
    value = loss(model(torch.randint(0, 32, (2, 8))), torch.randint(0, 32, (2, 8)))
    with _Ops() as ops:
        value.backward()
    blocks = SMALL["layers"]
    assert ops.counts.get("addmm.default", 0) == products * blocks, ops.counts
    assert ops.counts.get("_scaled_dot_product_flash_attention_for_cpu.default", 0) == attention * blocks, ops.counts


@pytest.mark.parametrize("value", [True, "true", "True", "full", "FULL"])
def test_checkpoint_true_means_full(value):
    assert checkpoint_mode(value) == "full" and GPT(**SMALL, checkpoint=value).checkpoint == "full"


@pytest.mark.parametrize("value", [False, "false", "none"])
def test_checkpoint_false_means_none(value):
    assert checkpoint_mode(value) == "none" and GPT(**SMALL, checkpoint=value).checkpoint == "none"


def test_checkpoint_true_false_and_the_modes_from_the_command_line(capsys):
    """What the sweeps type (conf/sweep/llm.yaml, search's axis: false, true) and the modes' names pass the config
    check; anything else is refused in one line naming the key and what is allowed, exit 2."""
    for value in ("true", "false", "none", "full", "selective"):
        cli.precheck(["model=gpt", f"model.checkpoint={value}"])
    with pytest.raises(SystemExit) as info:
        cli.precheck(["model=gpt", "model.checkpoint=sometimes"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == cli.EXIT_BAD_INPUT and len(lines) == 1, lines
    assert lines[0].startswith("error: model.checkpoint=sometimes is not allowed:"), lines
    assert all(mode in lines[0] for mode in ("true", "false", "none", "full", "selective")), lines


@pytest.mark.parametrize("chunks", [1, 3, 32, 100])
def test_a_loss_in_chunks_is_the_plain_loss_with_the_same_gradients(chunks):
    """3 pieces of 32 tokens: uneven; 100: more pieces than tokens (torch.chunk makes 32)."""
    x, y = torch.randint(0, 32, (4, 8)), torch.randint(0, 32, (4, 8))
    torch.manual_seed(0)
    plain_loss, plain_grads = _loss_and_gradients(GPT(**SMALL), x, y)
    torch.manual_seed(0)
    model = GPT(**SMALL, loss_chunks=chunks)
    chunked_loss, chunked_grads = _loss_and_gradients(model, x, y)
    torch.testing.assert_close(chunked_loss, plain_loss)
    for plain, chunked in zip(plain_grads, chunked_grads, strict=True):
        torch.testing.assert_close(chunked, plain)


def test_the_loss_a_run_takes_is_the_models_own_through_its_wrappers():
    model = GPT(**SMALL, loss_chunks=2)
    assert loss_for(model) == model.loss
    assert loss_for(torch.nn.DataParallel(model)) == model.loss  # .module, as DDP holds it too
    assert loss_for(torch.nn.Linear(2, 2)) is loss  # no loss of its own: the shared one
    holder = torch.nn.Module()
    holder.loss = torch.nn.CrossEntropyLoss()  # a submodule named loss is not a loss method
    assert loss_for(holder) is loss


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_grouped_query_attention_is_multi_head_attention_over_repeated_key_and_value_heads(kv_heads, monkeypatch):
    """float64: 4 query heads of width 4 sharing `kv_heads` key/value heads, against attention written out by hand
    (each query head's scores over its group's key head, causal mask, softmax, its group's values); the same with
    the key and value heads repeated before the kernel (torch before 2.5)."""
    torch.manual_seed(0)
    width, heads, length = 16, 4, 6
    block = GPT(layers=1, width=width, heads=heads, kv_heads=kv_heads, seq_len=length).double().blocks[0].attention
    x = torch.randn(2, length, width, dtype=torch.float64)
    head = width // heads
    q, k, v = block.qkv(x).split((width, kv_heads * head, kv_heads * head), dim=-1)
    q = q.view(2, length, heads, head).transpose(1, 2)
    k, v = (t.view(2, length, kv_heads, head).transpose(1, 2).repeat_interleave(heads // kv_heads, dim=1)
            for t in (k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(head)
    scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    expected = block.out((F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(2, length, width))
    no_rotation = torch.ones(length, head // 2, dtype=torch.float64), torch.zeros(length, head // 2, dtype=torch.float64)
    torch.testing.assert_close(block(x, *no_rotation), expected)
    monkeypatch.setattr(gpt, "_GQA_KERNEL", False)
    torch.testing.assert_close(block(x, *no_rotation), expected)
    assert block.qkv.out_features == width + 2 * kv_heads * head


@pytest.mark.parametrize(("options", "key"), [({"width": 18, "heads": 4}, "model.width"),
                                             ({"layers": 0}, "model.layers"), ({"shape": "bert"}, "model.shape"),
                                             ({"kv_heads": 3}, "model.kv_heads"), ({"kv_heads": 0}, "model.kv_heads"),
                                             ({"ffn_multiplier": 1.3}, "model.ffn_multiplier"),
                                             ({"mlp_hidden": 0}, "model.mlp_hidden"),
                                             ({"positions": "alibi"}, "model.positions"),
                                             ({"rope_theta": 0.0}, "model.rope_theta"),
                                             ({"loss_chunks": -1}, "model.loss_chunks"),
                                             ({"checkpoint": "op"}, "model.checkpoint")])
def test_a_shape_that_cannot_be_built_is_named(options, key):
    with pytest.raises(ConfigError, match=key) as info:
        GPT(**{**SMALL, **options})
    assert (info.value.key, info.value.value) == (key, options[key.removeprefix("model.")])


def test_the_swiglu_hidden_size_is_metas_and_its_defaults_keep_the_first_size():
    assert swiglu_hidden(4096, 1.3, 1024) == 14336  # Llama 3 8B
    assert swiglu_hidden(8192, 1.3, 4096) == 28672  # Llama 3 70B
    assert swiglu_hidden(16384, 1.2, 4096) == 53248  # Llama 3.1 405B
    assert swiglu_hidden(4096, None, 256) == 11008  # Llama 2 7B
    for width in range(1, 4097):  # multiple_of 8, no multiplier: the llama shape's hidden size before these options
        assert swiglu_hidden(width, None, 8) == 8 * math.ceil(8 * width / 3 / 8), width
    assert GPT(**SMALL, shape="llama", mlp_hidden=24).blocks[0].mlp.down.in_features == 24
    assert GPT(**SMALL, mlp_hidden=24).blocks[0].mlp.down.in_features == 24
    assert GPT(**SMALL).blocks[0].mlp.down.in_features == 4 * 16


def _hand_count(layers: int, width: int, heads: int, vocab: int, seq_len: int, *, kv_heads: int | None = None,
                hidden: int, gated: bool, bias: bool, tied: bool, learned_positions: bool, layer_norm: bool) -> int:
    """The published shape formula: token embedding (+ learned positions) + per layer [attention: q (width x width),
    k and v (width x kv_heads x head width each), out (width x width), their biases; MLP: up (gated: twice), down,
    their biases; two norms] + the final norm + the output head unless tied. A LayerNorm has a weight and (with
    biases) a bias of `width`; an RMSNorm a weight only."""
    kv = (kv_heads or heads) * (width // heads)
    attention = width * width + 2 * width * kv + width * width + (bias and width + 2 * kv + width)
    mlp = (2 if gated else 1) * width * hidden + hidden * width + (bias and (2 if gated else 1) * hidden + width)
    norm = width * (2 if layer_norm and bias else 1)
    return (vocab * width + (seq_len * width if learned_positions else 0) + layers * (attention + mlp + 2 * norm)
            + norm + (0 if tied else width * vocab))


GPT2 = dict(gated=False, bias=True, tied=True, learned_positions=True, layer_norm=True)
MPT = dict(vocab=50368, seq_len=2048, gated=False, bias=False, tied=True, learned_positions=False, layer_norm=True)
LLAMA = dict(gated=True, bias=False, tied=False, learned_positions=False, layer_norm=False)
# name: (the shape's figures, as published, for the hand count; the published parameter count, and to what it is
# stated: 1 = exactly)
NAMED = {
    "gpt2_124m": (dict(layers=12, width=768, heads=12, vocab=50257, seq_len=1024, hidden=4 * 768, **GPT2),
                  124_439_808, 1),
    "gpt2_350m": (dict(layers=24, width=1024, heads=16, vocab=50257, seq_len=1024, hidden=4 * 1024, **GPT2),
                  355_000_000, 1_000_000),  # "355M"
    "llama2_7b": (dict(layers=32, width=4096, heads=32, vocab=32000, seq_len=4096, hidden=11008, **LLAMA),
                  6_738_415_616, 1),
    "llama2_13b": (dict(layers=40, width=5120, heads=40, vocab=32000, seq_len=4096, hidden=13824, **LLAMA),
                   13_015_864_320, 1),
    "llama2_70b": (dict(layers=80, width=8192, heads=64, kv_heads=8, vocab=32000, seq_len=4096, hidden=28672,
                        **LLAMA), 68_976_648_192, 1),
    "llama3_8b": (dict(layers=32, width=4096, heads=32, kv_heads=8, vocab=128256, seq_len=8192, hidden=14336, **LLAMA),
                  8_030_261_248, 1),
    "llama3_70b": (dict(layers=80, width=8192, heads=64, kv_heads=8, vocab=128256, seq_len=8192, hidden=28672,
                        **LLAMA), 70_553_706_496, 1),
    "llama3_405b": (dict(layers=126, width=16384, heads=128, kv_heads=8, vocab=128256, seq_len=8192, hidden=53248,
                         **LLAMA), 406_000_000_000, 1_000_000_000),  # "405B": 405.85e9, the hub's "406B"
    **{f"mpt_{size}": (dict(layers=layers, width=width, heads=heads, hidden=4 * width, **MPT), None, None)
       for size, width, heads, layers in (("125m", 768, 12, 12), ("350m", 1024, 16, 24), ("760m", 1536, 12, 24),
                                          ("1b", 2048, 16, 24), ("3b", 2560, 20, 32), ("7b", 4096, 32, 32),
                                          ("13b", 5120, 40, 40), ("30b", 7168, 56, 48), ("70b", 8192, 64, 80))},
}


def test_every_named_size_is_counted_here():
    named = {p.stem for p in (CONF_DIR / "model").glob("*.yaml")} - {"auto", "custom", "gpt", "resnet18", "resnet50",
                                                                       "resnet101", "tiny_cnn", "vit"}
    assert named == set(NAMED)


@pytest.mark.parametrize("name", sorted(NAMED))
def test_a_named_size_has_the_published_parameter_count(name):
    """conf/model/<name>.yaml's options (over conf/model/gpt.yaml's: none) built on the meta device: the count
    worked by hand from the shape, and the published figure to the precision it is given in."""
    shape, published, precision = NAMED[name]
    options = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")).items()
               if k != "defaults"}
    with torch.device("meta"):
        model = GPT(**options)
    count = sum(p.numel() for p in model.parameters())
    assert count == _hand_count(**shape)
    if published is not None:
        assert round(count / precision) * precision == published, count


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
                            "log_every=10", "data=tokens", f"data.file={tmp_path / 'tokens.bin'}", tmp_path=tmp_path,
                            one_core=True)
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
    assert (fsdp.parity.verdict, fsdp.parity.reference) == (verdicts.AGREES, "single O0"), fsdp.parity.note
    assert fsdp.memory.params_rank_mib * mib == pytest.approx(GPT_PARAM_BYTES / 2, rel=1e-6)  # the memory table's figure
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
