"""The one training loop every strategy and amp level runs through.

Inside a window nothing waits for the device: no .item(), no sync, no printing. The devices are
synchronized and the loss is read only at window edges, by the WindowClock.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from amp import Amp
from harness.core.inputs import Batch, loss_for
from harness.core.timing import Window, WindowClock
from harness.rank.data import BatchSource
from strategies.capabilities import pipeline_schedule_of

NoSync = Callable[[], contextlib.AbstractContextManager[Any]]
_NO_CONTEXT = contextlib.nullcontext()


def train(model: nn.Module, optimizer: torch.optim.Optimizer, amp: Amp,
          batches: BatchSource, clock: WindowClock, iterations: int | None, log_every: int,
          before_step: Callable[[int], None] = lambda it: None,
          on_window: Callable[[Window], None] = lambda w: None,
          decide: Callable[[Window], bool] | None = None,
          grad_accum: int = 1, no_sync: NoSync = contextlib.nullcontext,
          losses: list[torch.Tensor] | None = None) -> list[Window]:
    """`iterations` iterations, or (None) until `decide` stops the run at a window edge; each iteration trains
    on `batches.next()` (which counts how long the loop waited for it). With `grad_accum` N > 1 an
    iteration is one optimizer step over that batch cut into N micro-batches (views: nothing is copied),
    every micro-batch but the last inside the strategy's `no_sync()`; each micro-batch's loss is divided by
    N, so the gradient is the batch's mean as without accumulation. `losses` (numerical parity only) gets
    every iteration's loss as a detached device tensor, read after the loop: keeping it waits for nothing."""
    model.train()
    loss_of = loss_for(model)
    pipelined = pipeline_schedule_of(model)  # a pipeline's schedule runs forward and backward itself
    clock.start()
    for it in itertools.count(1) if iterations is None else range(1, iterations + 1):
        before_step(it)
        if pipelined is not None:
            loss = pipelined.forward_backward(batches.next(), amp)
        elif grad_accum == 1:
            images, labels = batches.next()
            with amp.forward_context():
                loss = loss_of(model(images), labels)
            amp.backward(loss)
        else:
            loss = accumulate(model, amp, split(batches.next(), grad_accum), no_sync)
        if losses is not None:
            losses.append(loss.detach())
        amp.step(optimizer)
        amp.zero_grad(optimizer)
        if it % log_every == 0:
            on_window(clock.edge(it, loss.item, decide))
            if clock.stop:
                break
    return clock.windows


def split(batch: Batch, parts: int) -> list[Batch]:
    """Consecutive slices of equal size (views: nothing is copied)."""
    images, labels = batch
    if images.shape[0] % parts:
        raise ValueError(f"grad_accum={parts} does not divide this rank's batch of {images.shape[0]}")
    return list(zip(images.chunk(parts), labels.chunk(parts), strict=True))


def accumulate(model: nn.Module, amp: Amp, micro: Sequence[Batch], no_sync: NoSync) -> torch.Tensor:
    """Forward and backward over the micro-batches; the batch's mean loss (a tensor: nothing waits)."""
    last = len(micro) - 1
    loss_of = loss_for(model)
    total: torch.Tensor | None = None
    for k, (images, labels) in enumerate(micro):
        with no_sync() if k < last else _NO_CONTEXT:
            with amp.forward_context():
                loss = loss_of(model(images), labels) / len(micro)
            amp.backward(loss)
        total = loss.detach() if total is None else total + loss.detach()
    assert total is not None
    return total


def compile_pass(model: nn.Module, amp: Amp, optimizer: torch.optim.Optimizer, batch: Batch, grad_accum: int,
                 no_sync: NoSync,
                 after_backward: Callable[[torch.optim.Optimizer], None] = lambda optimizer: None) -> None:
    """compile=true: one forward and backward before the clock, so torch.compile traces and compiles the
    model (forward and backward graphs) outside every timed window. The gradients are dropped without a
    step: the weights the timed run starts from are those of an uncompiled run (batch-norm's running
    statistics, which training never reads, have seen one batch more). `after_backward` (the strategy's
    `after_compile_pass`) runs before the gradients are dropped: it undoes what this backward did to the
    strategy's state (horovod's pending allreduces, PowerSGD's iteration count)."""
    model.train()
    if grad_accum > 1:
        accumulate(model, amp, split(batch, grad_accum), no_sync)
    else:
        with amp.forward_context():
            loss = loss_for(model)(model(batch[0]), batch[1])
        amp.backward(loss)
    after_backward(optimizer)
    amp.zero_grad(optimizer)
    model.zero_grad(set_to_none=True)  # O2: the optimizer's are the fp32 masters; the model's own go too
