"""The GPU operator model (harness.plan.gpu_model): operators recorded as a GPU would launch them, each timed at
its roofline by hand-worked figures, ranks waiting for the slowest, and the factors' band."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from harness.plan.gpu_model import (
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
                   OpCost("memory", "float32", "forward_backward", 0.0, 2e9, 1),
                   OpCost("memory", "float32", "optimizer", 0.0, 1e9, 2)), samples=8)
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
    assert optimizer_ops and all(o.kind == "memory" for o in optimizer_ops)
    assert all(o.kernels == 1 for o in optimizer_ops)  # two tensors: one launch per foreach op
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
    assert 0 < factors.conv <= 1 and 0 < factors.matmul <= 1 and 0 < factors.memory <= 1
    assert factors.cases >= 10 and factors.source
    low, high = factors.band()
    assert low < 1 < high and low * high == pytest.approx(1.0)


def test_a_step_of_many_tiny_kernels_takes_the_cpus_dispatch_time():
    """The CPU dispatching eager kernels runs ahead of the GPU: 100 one-byte kernels take 100 x 10 us, not 100
    launches of 10 us on the GPU plus nothing."""
    ops = StepOps(tuple(OpCost("memory", "float32", "forward_backward", 0.0, 1.0, 1) for _ in range(100)), samples=1)
    factors = GpuFactors(conv=0.5, matmul=0.5, memory=0.5, launch_us=1.0, sync_cv=0.0, dispatch_us=10.0)
    assert step_time(ops, PEAKS, 1000.0, factors).forward_backward_s == pytest.approx(100 * 10e-6)
