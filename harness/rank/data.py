"""Synthetic data: a small pool of global batches made once, on the device, before the clock starts.

Every strategy trains on the same global batches in the same order: each is drawn from the run's seed
on the CPU (so the same whatever the device), and a process keeps its shard of it, consecutive slices by
rank (DataParallel, one process, keeps the whole batch and splits it itself). Cycling through several
batches, rather than one, keeps the loss curve informative (a single batch is memorised within a few
windows); nothing but an index into a list happens inside the timed loop. The task can be learnt: each
image is its class's fixed random pattern plus noise, so the loss falls over fresh batches as it would on
real data, and amp levels can be compared by it."""

from __future__ import annotations

import torch

Batch = tuple[torch.Tensor, torch.Tensor]


def synthetic_batches(pool: int, global_batch: int, local_batch: int, shard: int, image_size: int,
                      num_classes: int, device: torch.device, seed: int) -> list[Batch]:
    generator = torch.Generator().manual_seed(seed)
    patterns = torch.randn(num_classes, 3, image_size, image_size, generator=generator)
    start = shard * local_batch
    batches = []
    for _ in range(pool):
        labels = torch.randint(0, num_classes, (global_batch,), generator=generator)
        images = patterns[labels] + torch.randn(global_batch, 3, image_size, image_size, generator=generator)
        batches.append((images[start:start + local_batch].to(device, copy=True),
                        labels[start:start + local_batch].to(device, copy=True)))
    return batches
