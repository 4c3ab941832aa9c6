"""The one training loop every strategy and amp level runs through.

Inside a window nothing waits for the device: no .item(), no sync, no printing. The devices are
synchronized and the loss is read only at window edges, by the WindowClock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from amp import Amp
from harness.rank.timing import Window, WindowClock


def train(model: nn.Module, optimizer: torch.optim.Optimizer, amp: Amp,
          batches: Sequence[tuple[torch.Tensor, torch.Tensor]], clock: WindowClock, iterations: int | None, log_every: int,
          before_step: Callable[[int], None] = lambda it: None,
          on_window: Callable[[Window], None] = lambda w: None,
          decide: Callable[[Window], bool] | None = None,
          losses: list[torch.Tensor] | None = None) -> list[Window]:
    """`iterations` iterations, or (None) until `decide` stops the run at a window edge; iteration `it`
    trains on `batches[it % len(batches)]`. `losses` (numerical parity only) gets every iteration's loss
    as a detached device tensor, read after the loop: keeping it waits for nothing."""
    model.train()
    clock.start()
    for it in itertools.count(1) if iterations is None else range(1, iterations + 1):
        before_step(it)
        images, labels = batches[it % len(batches)]
        with amp.forward_context():
            loss = F.cross_entropy(model(images), labels)
        if losses is not None:
            losses.append(loss.detach())
        amp.backward(loss)
        amp.step(optimizer)
        amp.zero_grad(optimizer)
        if it % log_every == 0:
            on_window(clock.edge(it, loss.item, decide))
            if clock.stop:
                break
    return clock.windows
