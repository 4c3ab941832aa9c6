"""The GPU operator model (harness.prediction.gpu_model): operators recorded as a GPU would launch them, each timed at
its roofline by hand-worked figures, ranks waiting for the slowest, and the factors' band."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from harness.prediction.gpu_model import (
    GpuFactors,
    OpCost,
    StepOps,
    expected_max_normal,
    load_factors,
    record_step,
    step_time,
    straggle,
)

PEAKS = {"float32": 10.0, "tf32": 100.0, "bfloat16": 200.0, "float16": 200.0}  # TFLOP/s
FACTORS = GpuFactors(conv=0.5, matmul=0.25, memory=0.5, launch_us=10.0, sync_cv=0.1)


def test_each_operator_takes_the_longer_of_its_flops_and_its_bytes_plus_a_launch():
    ops = StepOps((OpCost("conv", "float32", "forward_backward", 1e12, 1e9, 1),  # compute-bound
                   OpCost("conv", "float16", "forward_backward", 1e10, 1e10, 1),  # memory-bound
                   OpCost("elementwise", "float32", "forward_backward", 0.0, 2e9, 1),
                   OpCost("elementwise", "float32", "optimizer", 0.0, 1e9, 2)), samples=8)
    time = step_time(ops, PEAKS, memory_gbps=1000.0, factors=FACTORS)
    # conv fp32 at TF32 (cuDNN's default): 1e12 / (100e12 x 0.5) = 0.02 s; at float32's peak it would be 0.2 s
    # conv fp16: max(1e10 / (200e12 x 0.5), 1e10 / (1000e9 x 0.5)) = max(1e-4, 0.02) = 0.02 s
    # memory: 2e9 / 5e11 = 0.004 s; three launches of 10 us
    assert time.forward_backward_s == pytest.approx(0.02 + 0.02 + 0.004 + 3e-5)
    assert time.optimizer_s == pytest.approx(0.002 + 2e-5)  # a foreach op of two launches (the CPU keeps ahead)
    assert time.by_kind["conv"] == pytest.approx(0.04) and time.kernels == 5


def test_a_float32_matmul_uses_tf32_only_where_allowed():
    ops = StepOps((OpCost("matmul", "float32", "forward_backward", 1e12, 0.0, 1),), samples=1)
    strict = step_time(ops, PEAKS, 1000.0, FACTORS, tf32_matmul=False).forward_backward_s
    allowed = step_time(ops, PEAKS, 1000.0, FACTORS, tf32_matmul=True).forward_backward_s
    assert strict == pytest.approx(1e12 / (10e12 * 0.25) + 1e-5)
    assert allowed == pytest.approx(1e12 / (100e12 * 0.25) + 1e-5)
    no_tf32 = {k: v for k, v in PEAKS.items() if k != "tf32"}  # a V100: TF32 falls back to float32's rate
    assert step_time(ops, no_tf32, 1000.0, FACTORS, tf32_matmul=True).forward_backward_s == pytest.approx(strict)


def test_a_presets_kernel_share_scales_its_class_only():
    ops = StepOps((OpCost("matmul", "bfloat16", "forward_backward", 1e12, 0.0, 1),
                   OpCost("attention", "bfloat16", "forward_backward", 1e12, 0.0, 1),
                   OpCost("conv", "bfloat16", "forward_backward", 1e12, 0.0, 1)), samples=1)
    factors = GpuFactors(conv=0.5, matmul=0.25, memory=0.5, launch_us=0.0, sync_cv=0.0, attention=0.5)
    time = step_time(ops, PEAKS, 1000.0, factors, kernel_share={"matmul": 0.8, "attention": 0.4})
    # matmul 1e12 / (200e12 x 0.25 x 0.8) = 0.025 s; attention 1e12 / (200e12 x 0.5 x 0.4) = 0.025 s;
    # the convolution keeps the datasheet: 1e12 / (200e12 x 0.5) = 0.01 s
    assert time.by_kind["matmul"] == pytest.approx(0.025) and time.by_kind["attention"] == pytest.approx(0.025)
    assert time.by_kind["conv"] == pytest.approx(0.01)


def test_the_recorder_sees_each_kernel_once_with_its_flops_and_bytes():
    with torch.device("meta"):
        model = nn.Linear(64, 32)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
        x = torch.randn(16, 64)

        def forward_backward() -> None:
            model(x).sum().backward()

        def step() -> None:
            optimizer.step()
            optimizer.zero_grad()

        ops = record_step(forward_backward, step, samples=16)
    forward = [o for o in ops.ops if o.kind == "matmul"]
    # addmm forward 2*16*64*32, backward: the input's gradient is not needed (a leaf without grad), the weight's
    # mm 2*16*64*32
    assert sorted(o.flops for o in forward) == [2 * 16 * 64 * 32] * 2
    addmm = max(forward, key=lambda o: o.bytes)
    assert addmm.bytes == 4 * (32 + 16 * 64 + 64 * 32 + 16 * 32)  # bias, input, weight (a view: same bytes), output
    optimizer_ops = [o for o in ops.ops if o.phase == "optimizer"]
    assert optimizer_ops and all(o.kind == "elementwise" for o in optimizer_ops)
    # two tensors: one launch per foreach op, and 1/64 of one more (affine in the tensors: a step grown from fewer
    # blocks counts its multi-tensor launches as the full trace does)
    assert all(o.kernels == pytest.approx(1 + 1 / 64) for o in optimizer_ops)
    assert ops.samples == 16 and ops.flops == 4 * 16 * 64 * 32


def test_ranks_that_wait_for_each_other_wait_for_the_slowest():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_normal(8) == pytest.approx(1.4236, abs=1e-3)  # tables of normal order statistics
    assert straggle(8, FACTORS) == pytest.approx(1 + 0.1 * 1.4236, abs=1e-4)
    assert straggle(1, FACTORS) == 1.0


def test_the_shipped_factors_are_plausible_and_carry_a_band():
    factors = load_factors()
    assert 0 < factors.conv <= 2  # above 1: cuDNN's Winograd multiplies less than the direct count
    assert all(0 < getattr(factors, name) <= 1 for name in ("matmul", "memory", "grouped", "depthwise", "norm"))
    assert factors.cases >= 10 and factors.source
    low, high = factors.band()
    assert low < 1 < high and low * high == pytest.approx(1.0)


def test_a_step_of_many_tiny_kernels_takes_the_cpus_dispatch_time():
    """The CPU dispatching eager kernels runs ahead of the GPU: 100 one-byte kernels take 100 x 10 us, not 100
    launches of 10 us on the GPU plus nothing."""
    ops = StepOps(tuple(OpCost("elementwise", "float32", "forward_backward", 0.0, 1.0, 1) for _ in range(100)), samples=1)
    factors = GpuFactors(conv=0.5, matmul=0.5, memory=0.5, launch_us=1.0, sync_cv=0.0, dispatch_us=10.0)
    assert step_time(ops, PEAKS, 1000.0, factors).forward_backward_s == pytest.approx(100 * 10e-6)


def test_convolutions_are_told_apart_by_their_groups_and_counted_right():
    """Dense, grouped (ResNeXt's) and depthwise (EfficientNet's) convolutions are different classes; a grouped
    convolution's backward is counted at twice its forward (torch's own formula counts its weight gradient as if
    dense: 64x too many for a depthwise 3x3 over 64 channels)."""
    with torch.device("meta"):
        convs = [nn.Conv2d(64, 64, 3, padding=1, groups=g) for g in (1, 4, 64)]
        x = torch.randn(8, 64, 56, 56, requires_grad=True)
        optimizer = torch.optim.SGD([p for c in convs for p in c.parameters()], lr=0.1)

        def forward_backward() -> None:
            sum(c(x).sum() for c in convs).backward()

        def step() -> None:
            optimizer.step()
            optimizer.zero_grad()

        ops = record_step(forward_backward, step, samples=8)
    by_kind: dict[str, list[float]] = {}
    for op in ops.ops:
        if op.kind.startswith("conv"):
            by_kind.setdefault(op.kind, []).append(op.flops)
    dense = 2 * 8 * 64 * 64 * 9 * 56 * 56  # 2 x batch x out x in/groups x kernel x output pixels
    assert sorted(by_kind["conv"]) == [dense, 2 * dense]  # forward; both gradients
    assert sorted(by_kind["conv_grouped"]) == [dense / 4, 2 * dense / 4]
    assert sorted(by_kind["conv_depthwise"]) == [dense / 64, 2 * dense / 64]


def test_each_class_takes_its_own_factor():
    """A depthwise convolution's bytes at its own share of the bandwidth and its FLOPs at the CUDA cores' (float32)
    rate, even in float16; a normalisation's bytes at the norm share; a grouped convolution's FLOPs at its share."""
    factors = GpuFactors(conv=0.5, matmul=0.25, memory=0.5, launch_us=0.0, sync_cv=0.0, grouped=0.1, depthwise=0.2,
                         norm=0.4, dispatch_us=0.0)

    def seconds(*ops: OpCost) -> float:
        return step_time(StepOps(ops, 1), PEAKS, 1000.0, factors, channels_last=True).forward_backward_s

    # depthwise: max(1e12 / 10e12 (float32's peak, not float16's 200), 1e9 / (1000e9 x 0.2)) = max(0.1, 0.005)
    assert seconds(OpCost("conv_depthwise", "float16", "forward_backward", 1e12, 1e9, 1)) == pytest.approx(0.1)
    assert seconds(OpCost("conv_depthwise", "float16", "forward_backward", 1e9, 1e9, 1)) == pytest.approx(0.005)
    assert seconds(OpCost("norm", "float16", "forward_backward", 0.0, 1e9, 1)) == pytest.approx(1e9 / 4e11)
    assert seconds(OpCost("conv_grouped", "float16", "forward_backward", 1e12, 0.0, 1)) == pytest.approx(
        1e12 / (200e12 * 0.1))
    assert seconds(OpCost("reduction", "float32", "forward_backward", 0.0, 1e9, 1)) == pytest.approx(1e9 / 5e11)


def test_fused_attention_traced_on_the_cpu_counts_its_flops():
    """SDPA on fake CPU tensors takes the CPU's flash kernel, which torch.utils.flop_counter has no formula for
    (it counted 0); counted as torch counts the CUDA flash kernel: QK^T and PV, 2 x 2 x b x h x s^2 x d forward,
    twice that backward. The operator's time takes half of them: a causal kernel skips the blocks above the
    diagonal (the counter, for MFU, counts them all, as torch and PaLM's convention do)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from harness.prediction.gpu_model import FLOP_FORMULAS, OperatorRecorder

    with FakeTensorMode():
        q = torch.randn(2, 4, 128, 32, requires_grad=True)
        recorder = OperatorRecorder()
        with recorder, FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as counter:
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    forward = 2 * 2 * 2 * 4 * 128 * 128 * 32
    assert [(o.kind, o.flops) for o in recorder.ops if o.kind == "attention"] == [("attention", forward / 2),
                                                                               ("attention", forward)]
    assert counter.get_total_flops() == 3 * forward


def test_a_fused_kernel_is_one_operator_reading_and_writing_only_what_lives_outside_it():
    """The GPT's fused cross-entropy over 64 rows of 1000 bfloat16 logits in 2 chunks: each chunk one kernel. Forward
    reads its 32 x 1000 x 2 = 64,000 bytes of logits and 32 int64 targets (256) and writes its 32 float32
    log-sum-exps (128) and its float32 sum (4): 64,388; its float32 upcast and exponentials stay on chip. Backward reads the logits (64,000), the chunk's float32 log-sum-exps (128), its targets (256)
    and the incoming float32 gradient (4), and writes the gradient over the logits (64,000): 128,388. Counted op by
    op, the float32 temporaries alone would be 128,000 bytes each pass."""
    from harness.prediction.gpu_model import OperatorRecorder
    from harness.rank.gpt import FusedCrossEntropy

    with torch.device("meta"):
        logits = torch.randn(64, 1000, dtype=torch.bfloat16, requires_grad=True)
        targets = torch.randint(0, 1000, (64,))
    recorder = OperatorRecorder()
    with recorder:
        FusedCrossEntropy.apply(logits * 1, targets, 2).backward()
    fused = [op.bytes for op in recorder.ops if op.kind == "reduction" and op.dtype == "bfloat16"]
    assert fused == [64_388, 64_388, 128_388, 128_388]
    assert all(op.kernels == 1 for op in recorder.ops)


def test_a_cuda_trace_takes_the_fused_rms_norm_one_kernel_a_pass_keeping_the_input_and_a_float_a_row():
    """RMSNorm over 64 rows of 1024 bfloat16 values: the fused kernel reads 131,072 bytes and the 2,048-byte weight
    and writes 131,072 bytes of output and 64 float32 reciprocal RMS (256); backward reads the input, the incoming
    gradient, the weight and the 256 bytes of statistics, and writes the input's and the weight's gradients. Backward
    keeps the input and the statistics (and the weight), where the decomposition keeps three float32 copies of the
    input's size."""
    from harness.prediction.gpu_model import OperatorRecorder
    from harness.prediction.trace import fused_attention

    with torch.device("meta"):
        x = torch.randn(64, 1024, dtype=torch.bfloat16, requires_grad=True)
        norm = nn.RMSNorm(1024).to(torch.bfloat16)
    kept: list[int] = []
    recorder = OperatorRecorder()
    with fused_attention("cuda"), recorder, torch.autograd.graph.saved_tensors_hooks(
            lambda t: kept.append(t.numel() * t.element_size()) or t, lambda t: t):
        norm(x * 1).sum().backward()
    norms = [op.bytes for op in recorder.ops if op.kind == "norm"]
    assert norms == [131_072 + 2_048 + 131_072 + 256, 131_072 + 131_072 + 2_048 + 256 + 131_072 + 2_048]
    assert sorted(kept) == [256, 2_048, 131_072]  # the statistics, the weight (a parameter), the input
