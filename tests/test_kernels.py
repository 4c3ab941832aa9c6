"""harness/rank/kernels.py: the kernel options (kernels.cudnn_benchmark, kernels.channels_last,
kernels.matmul_precision) reach torch in the rank, and the record says what torch had, not what was asked."""

from __future__ import annotations

import pytest
import torch
from conftest import rank_spec

from harness.core.config import KernelsConfig
from harness.core.inputs import images, tokens
from harness.rank import kernels
from harness.rank.worker import run_rank


@pytest.fixture
def torch_flags():
    """The process-wide flags, put back after the test (the suite's other tests run in this process)."""
    saved = torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision()
    yield
    torch.backends.cudnn.benchmark = saved[0]
    torch.set_float32_matmul_precision(saved[1])


def test_the_layout_is_nhwc_for_image_models_only():
    on = KernelsConfig(channels_last=True)
    assert kernels.memory_format(on, images(8, 10)) is torch.channels_last
    assert kernels.memory_format(on, tokens(8, 10)) is torch.contiguous_format
    assert kernels.memory_format(KernelsConfig(channels_last=False), images(8, 10)) is torch.contiguous_format


@pytest.mark.parametrize("asked", [{"cudnn_benchmark": False, "channels_last": True, "matmul_precision": "high"},
                                   {"cudnn_benchmark": True, "channels_last": False, "matmul_precision": "highest"}])
def test_a_rank_runs_with_the_options_and_records_what_torch_had(asked, torch_flags, tmp_path):
    record = run_rank(rank_spec(tmp_path, kernels=asked))
    assert record.ok, record.error
    # read back from torch and from the model's convolution weights; cudnn.benchmark applies on CUDA only
    assert record.kernels == {**asked, "cudnn_benchmark": None}
    assert torch.get_float32_matmul_precision() == asked["matmul_precision"]
    assert torch.backends.cudnn.benchmark is asked["cudnn_benchmark"]


def test_image_batches_are_laid_out_as_the_model():
    from harness.rank.data import synthetic_batches

    (x, y), = synthetic_batches(1, 4, 4, 0, images(8, 10), torch.device("cpu"), 0, torch.channels_last)
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() and y.shape == (4,)
    (x, _), = synthetic_batches(1, 4, 4, 0, images(8, 10), torch.device("cpu"), 0)
    assert x.is_contiguous()
