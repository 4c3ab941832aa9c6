"""A workload of your own: a model factory and a batch factory, in your package (docs/workloads.md).

    python run.py model=custom model._target_=examples.custom_workload.build \\
        data=custom data._target_=examples.custom_workload.batches strategy=fsdp

The model is a residual MLP over feature vectors (tabular data, say); its blocks are the units FSDP2 shards
(`block_names`). A batch is `n` samples of FEATURES features, each labelled with one of CLASSES classes."""

from __future__ import annotations

import torch
from torch import nn

FEATURES, CLASSES = 32, 8
CENTRES_SEED = 1234  # each class's centre: the same in every batch, so the model has something to learn


class ResidualMLP(nn.Module):
    def __init__(self, width: int = 64, depth: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(),
                                                  nn.Linear(2 * width, width)) for _ in range(depth))
        self.out = nn.Linear(width, CLASSES)

    def block_names(self) -> list[str]:
        """The submodules strategies treat as units (FSDP2 shards each one)."""
        return [f"blocks.{i}" for i in range(len(self.blocks))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)  # (n, CLASSES) logits: the harness takes cross-entropy against the targets


def build(width: int = 64, depth: int = 2) -> nn.Module:
    """The model factory `model._target_` names: its keyword arguments are the model's options
    (`+model.width=128`)."""
    return ResidualMLP(width, depth)


def batches(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch factory `data._target_` names: `n` samples drawn from `generator` on the CPU, as (inputs, targets)
    with the samples in the first dimension; targets are class ids for the cross-entropy."""
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(CENTRES_SEED))
    labels = torch.randint(0, CLASSES, (n,), generator=generator)
    return centres[labels] + torch.randn(n, FEATURES, generator=generator), labels
