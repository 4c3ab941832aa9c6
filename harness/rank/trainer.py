"""The one training loop every strategy and amp level runs through.

Inside a window nothing waits for the device: no .item(), no sync, no printing. The devices are
synchronized and the loss is read only at window edges, by the WindowClock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from amp import Amp
from harness.rank.data import BatchSource
from harness.rank.timing import Window, WindowClock


def train(model: nn.Module, optimizer: torch.optim.Optimizer, amp: Amp,
          batches: BatchSource, clock: WindowClock, iterations: int | None, log_every: int,
          before_step: Callable[[int], None] = lambda it: None,
          on_window: Callable[[Window], None] = lambda w: None,
          decide: Callable[[Window], bool] | None = None) -> list[Window]:
    """`iterations` iterations, or (None) until `decide` stops the run at a window edge; each iteration trains
    on `batches.next()` (which counts how long the loop waited for it)."""
    model.train()
    clock.start()
    for it in itertools.count(1) if iterations is None else range(1, iterations + 1):
        before_step(it)
        images, labels = batches.next()
        with amp.forward_context():
            loss = F.cross_entropy(model(images), labels)
        amp.backward(loss)
        amp.step(optimizer)
        amp.zero_grad(optimizer)
        if it % log_every == 0:
            on_window(clock.edge(it, loss.item, decide))
            if clock.stop:
                break
    return clock.windows
