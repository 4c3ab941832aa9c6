"""This machine's measured compute for one rank's step: forward and backward, and the optimizer step, timed
on real tensors (on CPU in this process, the parent, while no worker runs; on a GPU in a child process, the
device synchronized at each edge) at the rank's micro-batch and thread count. A prediction's compute is this calibration: on this machine directly, on a preset scaled by FLOPs and
by the ratio of peak rates (harness.plan.predict)."""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from hydra.utils import instantiate

from amp import AmpSpec, OptimizerSpec
from amp.native import NativeAmp
from harness.plan.trace import _freeze

WARMUP_STEPS = 2
MIN_STEPS, MAX_STEPS, MIN_SECONDS = 5, 20, 1.5


@dataclass(frozen=True)
class Calibration:
    forward_backward_s: float  # one optimizer step's forward and backward passes (every micro-batch)
    optimizer_s: float
    steps: int
    micro_batch: int
    threads: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def calibrate(model_cfg: Mapping[str, Any], num_classes: int, amp: AmpSpec, optim: Mapping[str, Any],
              micro_batch: int, image_size: int, grad_accum: int, threads: int, device: str = "cpu") -> Calibration:
    """On `device` "cuda" the calibration runs in a spawned child process on the first visible GPU: the parent
    never creates a CUDA context (its workers, forked or not, own the GPUs)."""
    args = (_freeze(model_cfg), num_classes, amp, _freeze(optim), micro_batch, image_size, grad_accum, threads)
    if device == "cuda":
        return _in_child(*args)
    return _calibrate(*args, "cpu")


@functools.lru_cache(maxsize=32)
def _in_child(*args: Any) -> Calibration:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_calibrate.__wrapped__, *args, "cuda").result()


@functools.lru_cache(maxsize=32)
def _calibrate(model_cfg: tuple[tuple[str, Any], ...], num_classes: int, amp: AmpSpec,
               optim: tuple[tuple[str, Any], ...], micro_batch: int, image_size: int, grad_accum: int,
               threads: int, device_type: str) -> Calibration:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    device = torch.device(device_type)
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    try:
        torch.manual_seed(0)
        model = instantiate({k: list(v) if isinstance(v, tuple) else v for k, v in model_cfg}, num_classes=num_classes)
        plugin = NativeAmp(dataclasses.replace(amp, allow_emulated=True), device)
        model = plugin.cast_module(model.to(device))
        optimizer = OptimizerSpec.from_config(dict(optim)).build(plugin.optimizer_params(model))
        model = plugin.wrap_module(model).train()
        images = torch.randn(micro_batch * grad_accum, 3, image_size, image_size, device=device)
        labels = torch.randint(0, num_classes, (micro_batch * grad_accum,), device=device)
        passes, steps = [], []
        started = time.perf_counter()
        for index in range(WARMUP_STEPS + MAX_STEPS):
            sync()
            begin = time.perf_counter()
            for part, part_labels in zip(images.chunk(grad_accum), labels.chunk(grad_accum), strict=True):
                with plugin.forward_context():
                    loss = F.cross_entropy(model(part), part_labels) / grad_accum
                plugin.backward(loss)
            sync()
            middle = time.perf_counter()
            plugin.step(optimizer)
            plugin.zero_grad(optimizer)
            sync()
            end = time.perf_counter()
            if index >= WARMUP_STEPS:
                passes.append(middle - begin)
                steps.append(end - middle)
                if len(passes) >= MIN_STEPS and end - started >= MIN_SECONDS:
                    break
        return Calibration(statistics.median(passes), statistics.median(steps), len(passes), micro_batch, threads)
    finally:
        torch.set_num_threads(previous)
