"""What one sample is for the model a run trains: its input's shape, its target, and what it counts as (an
image, or a sequence of tokens). One answer for the batches a rank trains on, the planner's traced and
calibrated steps, and the report's throughput (images/s, or tokens/s where a sample is a sequence).

A model plugin says what it takes with a class method `inputs(options, data) -> Inputs` on its `_target_`
(harness.rank.gpt.GPT does); one that says nothing takes images of `data.image_size` and `data.num_classes`
classes, as every torchvision classifier does. The loss is the same for every workload: cross-entropy over
the output's last dimension (a classifier's (N, classes) logits, a language model's (N, T, vocabulary)),
averaged over every target (each image, each token)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from harness.core.options import HYDRA_KEYS

Batch = tuple[torch.Tensor, torch.Tensor]
REPEAT_NEXT = 0.8  # synthetic tokens: the share that follow the fixed next-token table (the rest are random)


@dataclass(frozen=True)
class Inputs:
    """`kind` images: (3, size, size) float inputs, one class id per sample. `kind` tokens: `shape[0]` token ids
    in, the next token of each position out. `provided`: the keywords the harness passes the model factory."""

    kind: Literal["images", "tokens"]
    shape: tuple[int, ...]
    classes: int  # targets are ids below this: the classes, or the vocabulary
    provided: tuple[tuple[str, Any], ...] = ()  # hashable: the planner caches traces by it

    @property
    def tokens_per_sample(self) -> int | None:
        """A sequence's length, for tokens/s; None for images."""
        return self.shape[0] if self.kind == "tokens" else None

    @property
    def input_bytes(self) -> int:
        """One sample's input and target as the device holds them (fp32 pixels, int64 ids)."""
        if self.kind == "tokens":
            return 2 * self.shape[0] * 8
        return 4 * self.shape[0] * self.shape[1] * self.shape[2] + 8

    def example(self, n: int, device: torch.device | str | None = None) -> Batch:
        """`n` random samples: what the planner traces and calibrates a step with (values do not matter)."""
        if self.kind == "tokens":
            return (torch.randint(0, self.classes, (n, *self.shape), device=device),
                    torch.randint(0, self.classes, (n, *self.shape), device=device))
        return torch.randn(n, *self.shape, device=device), torch.randint(0, self.classes, (n,), device=device)

    def batches(self, count: int, n: int, generator: torch.Generator) -> list[Batch]:
        """`count` learnable batches of `n` samples, drawn from `generator` on the CPU: images are their class's
        fixed random pattern plus noise; token sequences follow a fixed random next-token table
        (REPEAT_NEXT of the time) and are otherwise random, so the loss falls as on real data."""
        if self.kind == "tokens":
            table = torch.randint(0, self.classes, (self.classes,), generator=generator)
            out = []
            for _ in range(count):
                length = self.shape[0] + 1
                sequence = torch.empty(n, length, dtype=torch.long)
                sequence[:, 0] = torch.randint(0, self.classes, (n,), generator=generator)
                noise = torch.randint(0, self.classes, (n, length), generator=generator)
                follow = torch.rand(n, length, generator=generator) < REPEAT_NEXT
                for t in range(1, length):
                    sequence[:, t] = torch.where(follow[:, t], table[sequence[:, t - 1]], noise[:, t])
                out.append((sequence[:, :-1].contiguous(), sequence[:, 1:].contiguous()))
            return out
        patterns = torch.randn(self.classes, *self.shape, generator=generator)
        out = []
        for _ in range(count):
            labels = torch.randint(0, self.classes, (n,), generator=generator)
            out.append((patterns[labels] + torch.randn(n, *self.shape, generator=generator), labels))
        return out


def images(image_size: int, num_classes: int) -> Inputs:
    return Inputs("images", (3, image_size, image_size), num_classes, (("num_classes", num_classes),))


def tokens(seq_len: int, vocab_size: int) -> Inputs:
    return Inputs("tokens", (seq_len,), vocab_size)


def inputs_of(model: Mapping[str, Any], image_size: int, num_classes: int) -> Inputs:
    """What the model of `model` (its config section) takes: what its `_target_`'s `inputs` class method says,
    else images (`data.image_size`, `data.num_classes`)."""
    from hydra.utils import get_object

    declare = getattr(get_object(str(model["_target_"])), "inputs", None)
    if callable(declare):
        options = {k: v for k, v in model.items() if k not in HYDRA_KEYS}
        return declare(options, image_size=image_size, num_classes=num_classes)
    return images(image_size, num_classes)


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dimension, averaged over every target: a classifier's (N, C) logits against
    (N,) classes, a language model's (N, T, V) against (N, T) next tokens."""
    return F.cross_entropy(outputs.flatten(0, -2), targets.flatten())
