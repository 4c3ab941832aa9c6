"""harness.core.devices: a rank's DeviceOps (where tensors go, which devices it waits for, what counts as out
of memory), checked without any GPU. Placing ranks on devices: tests/test_placement.py."""

from __future__ import annotations

import pytest
import torch
from conftest import run_config

from harness.core.devices import DeviceOps
from harness.launch.placement import Hardware, place

FOUR_GPUS = Hardware(visible_gpus=(0, 1, 2, 3), cores=16)


def place_as(cfg, hw, layout):
    one_per_device, drives_all, needs_cuda = {"per_device": (True, False, False), "all": (False, True, True)}[layout]
    return place(cfg, hw, one_process_per_device=one_per_device, drives_all_devices=drives_all,
                 needs_cuda=needs_cuda)


def test_cpu_device_ops():
    ops = DeviceOps("cpu", [])
    assert ops.device == torch.device("cpu")
    assert ops.dist_backend == "gloo"
    ops.synchronize()
    ops.reset_peaks()
    assert ops.allocator_peaks() == []
    assert DeviceOps.is_out_of_memory(MemoryError()) and DeviceOps.is_out_of_memory(torch.OutOfMemoryError())
    assert not DeviceOps.is_out_of_memory(RuntimeError("CUDA error: an illegal memory access"))


@pytest.mark.parametrize("message", [
    # NCCL inside a collective (torch.distributed.DistBackendError's text)
    "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
    "NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
    "Cuda failure 'out of memory'",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call",
])
def test_out_of_memory_inside_a_library_is_recognised(message):
    """Before: only torch.OutOfMemoryError/MemoryError counted; these were recorded `failed`."""
    assert DeviceOps.is_out_of_memory(RuntimeError(message))
    try:
        try:
            raise RuntimeError(message)
        except RuntimeError as inner:
            raise ValueError("instantiate failed") from inner
    except ValueError as wrapped:
        assert DeviceOps.is_out_of_memory(wrapped)


def test_other_cuda_errors_are_not_out_of_memory():
    for message in ("CUDA error: an illegal memory access was encountered", "CUBLAS_STATUS_EXECUTION_FAILED",
                    "NCCL error: remote process exited or there was a network error"):
        assert not DeviceOps.is_out_of_memory(RuntimeError(message))


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda without a GPU: which device was set, which were synchronized, in order."""
    calls: dict[str, list[int]] = {"set_device": [], "synchronize": []}
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls["set_device"].append(i))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda i=None: calls["synchronize"].append(i))
    return calls


def test_dataparallel_waits_for_every_gpu_it_drives(fake_cuda):
    """A window edge of DataParallel over GPUs 0,1,3 waits for all three (torch indices 0,1,2 inside)."""
    from strategies.base import RankEnv
    from strategies.dp import DataParallelStrategy

    p = place_as(run_config("single", gpus=[0, 1, 3]), FOUR_GPUS, "all")
    strategy = DataParallelStrategy()
    strategy.setup(RankEnv(0, 0, 1, p, timeout_s=10))
    strategy.synchronize()
    assert fake_cuda == {"set_device": [0], "synchronize": [0, 1, 2]}


def test_a_ddp_rank_waits_for_its_own_gpu_only(fake_cuda, monkeypatch):
    import torch.distributed as dist

    from strategies.base import RankEnv
    from strategies.ddp import TorchDDP

    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: None)
    p = place_as(run_config("ddp", gpus=[0, 1, 3]), FOUR_GPUS, "per_device")
    strategy = TorchDDP()
    strategy.setup(RankEnv(2, 2, 3, p, timeout_s=10))
    strategy.synchronize()
    assert fake_cuda == {"set_device": [2], "synchronize": [2]}
    assert strategy.ops.labels == ["cuda:3"]
