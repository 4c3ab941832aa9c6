"""Synthetic data: one batch made once on the device, so loading never limits the measurement."""

from __future__ import annotations

import torch


def synthetic_batch(batch: int, image_size: int, num_classes: int, device: torch.device,
                    seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)  # CPU generator: same data whatever the device
    images = torch.randn(batch, 3, image_size, image_size, generator=generator)
    labels = torch.randint(0, num_classes, (batch,), generator=generator)
    return images.to(device), labels.to(device)
