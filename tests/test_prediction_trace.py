"""harness.prediction.trace: attention as the run's device computes it, and a model of many alike blocks traced at
two and grown, checked against its full trace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from harness.core.amp_levels import resolve
from harness.core.config import AmpConfig
from harness.core.inputs import tokens
from harness.prediction import trace
from harness.prediction.gpu_model import FLOP_FORMULAS, GpuFactors, step_time

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu"
ORIGINAL = F.scaled_dot_product_attention


def _attention_ops(device: str, kv_heads: int, dropout: float = 0.0) -> set[str]:
    with torch.device("meta"):
        q = torch.randn(2, 4, 64, 16, requires_grad=True)
        k, v = (torch.randn(2, kv_heads, 64, 16, requires_grad=True) for _ in range(2))
    counter = FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS)
    with trace.fused_attention(device), counter:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout,
                                       enable_gqa=kv_heads != 4).sum().backward()
    return {str(op) for op in counter.get_flop_counts()["Global"]}


def test_attention_takes_the_kernel_the_device_would():
    """The meta device alone takes the math path (bmm over s x s scores); a CPU run takes its flash kernel
    where torch's CPU dispatch does (equal heads, no dropout), a GPU run a fused kernel always."""
    assert FLASH in _attention_ops("cpu", 4) and "aten.bmm" not in _attention_ops("cpu", 4)
    assert _attention_ops("cpu", 2) == {"aten.bmm"}  # grouped-query heads: the CPU's math path
    assert _attention_ops("cpu", 4, dropout=0.1) == {"aten.bmm"}
    assert FLASH in _attention_ops("cuda", 2) and FLASH in _attention_ops("cuda", 4, dropout=0.1)
    assert F.scaled_dot_product_attention is ORIGINAL  # put back after the trace


def test_fused_attention_keeps_no_scores():
    """At O0 on the CPU a GPT's trace no longer holds each head's s x s scores: with 4 blocks of width 64 over 4
    heads, sequences of 512 and a batch of 4, the scores are 4 x 4 x 512 x 512 x 4 bytes = 16 MiB a block; the
    whole step's activations stay below one block's scores x 4 blocks."""
    model = {"_target_": "harness.rank.gpt.GPT", "layers": 3, "width": 64, "heads": 4, "seq_len": 512,
             "vocab_size": 64}
    amp = resolve(AmpConfig(level="O0"), "cpu")
    sgd = {"_target_": "torch.optim.SGD", "lr": 0.1}
    fused = trace.trace_step(model, tokens(512, 64), amp, sgd, 4, device="cpu")
    scores = 4 * 4 * 512 * 512 * 4
    assert fused.activations < 3 * scores
    with pytest.MonkeyPatch.context() as patch:  # the math path, as the meta device alone would take it
        patch.setattr(trace, "fused_attention", lambda device: trace.contextlib.nullcontext())
        trace._trace.cache_clear()
        unfused = trace.trace_step(model, tokens(512, 64), amp, sgd, 4, device="cpu")
    trace._trace.cache_clear()
    assert unfused.activations > fused.activations + 3 * scores


@pytest.mark.parametrize(("level", "checkpoint"), [("O0", False), ("O1", True), ("O2", False)])
def test_many_blocks_grown_from_two_and_three_equal_the_full_trace(level: str, checkpoint: bool):
    """Seven blocks traced at two and three and grown: every byte count, the FLOPs, the units and the matrices,
    and the step's time on a preset as the full trace of seven gives them."""
    model = {"_target_": "harness.rank.gpt.GPT", "layers": 7, "width": 64, "heads": 4, "seq_len": 64,
             "vocab_size": 128, "checkpoint": checkpoint}
    amp = resolve(AmpConfig(level=level, dtype="bfloat16"), "cpu")
    adamw = {"_target_": "torch.optim.AdamW", "lr": 1e-3}
    inputs = tokens(64, 128)
    assert trace.repeated_blocks(model) == 7
    assert trace.repeated_blocks({**model, "layers": 3}) is None
    assert trace.repeated_blocks({"_target_": "torchvision.models.resnet18", "layers": 9}) is None  # no block_names

    def units(m: torch.nn.Module) -> list[str]:
        return list(m.block_names())

    full = trace._trace(trace.hashable(model), inputs, amp, trace.hashable(adamw), 2, 1, units, False, "cuda")
    grown = trace.trace_step(model, inputs, amp, adamw, 2, unit_names=units, device="cuda")
    assert grown.blocks == 7 and full.blocks == 0
    for name in trace.LINEAR_FIELDS:
        assert getattr(grown, name) == getattr(full, name), name
    assert grown.block_backward == full.block_backward > 0  # one block's, whatever the count
    assert grown.output_bytes == full.output_bytes > 0
    assert sorted(grown.units) == sorted(full.units) and len(grown.units) == 7
    assert sorted(grown.matrices) == sorted(full.matrices)

    factors = GpuFactors(conv=0.6, matmul=0.6, memory=0.7, launch_us=4.0, sync_cv=0.02)
    peaks = {"float32": 60.0, "bfloat16": 900.0}
    whole = step_time(trace._trace_ops(trace.hashable(model), inputs, amp, trace.hashable(adamw), 2, 1), peaks,
                      3000.0, factors)
    parts = step_time(trace.trace_ops(model, inputs, amp, adamw, 2), peaks, 3000.0, factors)
    assert parts.forward_backward_s == pytest.approx(whole.forward_backward_s, rel=1e-9)
    assert parts.optimizer_s == pytest.approx(whole.optimizer_s, rel=1e-9)
    assert parts.kernels == whole.kernels


def test_a_blocks_backward_adds_its_inputs_gradient_and_its_weights_beside_what_it_was_given():
    """Three bias-free linear blocks of width 64 on a batch of 32, float32, under MemTracker as the trace runs it: a
    block's backward makes its input's gradient (32 x 64 x 4 = 8 KiB) and its weight's (64 x 64 x 4 = 16 KiB) while
    the gradient it was given and the input it saved are alive: 24 KiB (the first block's input needs no gradient:
    16 KiB). Its peak activations (32 KiB with the gradient it was given) or the whole model's backward growth
    (16 KiB: the saved inputs freed as it goes) would be other figures."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(64, 64, bias=False) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    model = Chain()
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        model(torch.randn(32, 64)).square().sum().backward()
    cpu = torch.device("cpu")
    assert trace._block_backward(tracker, list(model.blocks), cpu) == 32 * 64 * 4 + 64 * 64 * 4
    assert trace._block_backward(tracker, [model.blocks[0]], cpu) == 64 * 64 * 4


@pytest.mark.parametrize("level", ["O0", "O1"])
def test_the_heads_backward_and_the_models_output_as_the_loss_sees_them(level: str):
    """GPT of vocabulary 256 on 4 sequences of 128, 2 blocks of width 64: its output, the logits, 4 x 128 x 256 x 4
    bytes at O0 and x 2
    at O1 (the model's own bfloat16, not the float32 copy the amp level's wrapper hands the loss). The step's backward
    adds two float32 logits to what is alive as it starts (log-softmax's gradient beside the one it was given; the
    loss runs in float32 under autocast too): 1 MiB; the step's peak activations (5.8 MiB at O0) or none would be
    other figures."""
    amp = resolve(AmpConfig(level=level, dtype="bfloat16"), "cpu")
    sgd = {"_target_": "torch.optim.SGD", "lr": 0.1}
    model = {"_target_": "harness.rank.gpt.GPT", "layers": 2, "width": 64, "heads": 4, "seq_len": 128,
             "vocab_size": 256}
    step = trace.trace_step(model, tokens(128, 256), amp, sgd, 4)
    logits = 4 * 128 * 256
    assert step.output_bytes == logits * (4 if level == "O0" else 2)
    assert step.backward_growth == 2 * logits * 4
    # autocast's bfloat16 copies of the weights it multiplies by, saved for backward: a block's q|k|v, out, MLP up and
    # down, 12 x 64 x 64, and the head's 256 x 64 (the embeddings' lookups are not cast), 2 bytes each; none at O0
    assert step.parameter_casts == (0 if level == "O0" else (2 * 12 * 64 * 64 + 256 * 64) * 2)


def test_a_parameters_cast_is_counted_once_however_many_forwards_save_it():
    """Two forwards through one Linear(64, 64) in one autocast region, their input needing a gradient: both save the
    weight's bfloat16 copy, which torch's autocast caches (64 x 64 x 2 bytes, once); the inputs' copies are casts of
    activations, not of a parameter, and the bias is not saved."""
    layer = torch.nn.Linear(64, 64)
    x = torch.randn(4, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), trace.ParameterCasts() as casts:
        layer(x), layer(x * 2)
    assert casts.bytes == 64 * 64 * 2


def test_the_activation_tracker_keeps_what_backward_starts_with_and_its_most_after():
    """Three bias-free linear layers of width 512 on a batch of 4, float32. Backward starts with the input (8 KiB,
    it requires a gradient), the second and third layers' saved inputs and the square's (8 KiB each) and the loss (4
    bytes): 32 KiB + 4. The activations peak as the last layer's weight gradient is made (1 MiB, a temporary until
    accumulated into .grad), beside the gradient it was given and its input's (8 KiB each), the loss's own (4 bytes),
    the square's saved input freed: 1 MiB + 8 KiB + 4 more. The step's total peaks later, at the first layer's
    weight gradient, two others already in .grad: what the total's peak shows is not what backward started with."""
    model = torch.nn.Sequential(*(torch.nn.Linear(512, 512, bias=False) for _ in range(3)))
    x = torch.randn(4, 512, requires_grad=True)
    cpu = torch.device("cpu")
    tracker = trace.activation_tracker()(cpu, 0)
    tracker.track_external(model, x)
    with tracker:
        out = model(x).square()
        loss = out.sum()
        del out
        tracker.mark()
        loss.backward()
    kib = 1024
    assert tracker.at_mark == 32 * kib + 4
    assert tracker.peak_since_mark == tracker.at_mark + 1024 * kib + 8 * kib + 4
    assert trace._phase_peak(tracker.get_tracker_snapshot("peak")[cpu], 0).grads == 2 * 1024 * kib


def test_the_model_flops_leave_recomputation_out():
    """MFU's FLOPs (3 x the forward's) are the same with checkpointing on and off, and equal what the step computes
    without it (backward: twice the forward for every matmul and attention); with full checkpointing the step
    computes more (the forward again)."""
    amp = resolve(AmpConfig(level="O0"), "cpu")
    sgd = {"_target_": "torch.optim.SGD", "lr": 0.1}
    model = {"_target_": "harness.rank.gpt.GPT", "layers": 2, "width": 64, "heads": 4, "seq_len": 64,
             "vocab_size": 128}
    plain, full = (trace.trace_step({**model, "checkpoint": c}, tokens(64, 128), amp, sgd, 2) for c in ("none", "full"))
    assert plain.model_flops == full.model_flops == plain.flops
    assert full.flops > full.model_flops
