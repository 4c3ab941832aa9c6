"""What one sample is for the model a run trains: its input's shape, its target, and what it counts as (an
image, or a sequence of tokens). One answer for the batches a rank trains on, the planner's traced and
calibrated steps, and the report's throughput (images/s, or tokens/s where a sample is a sequence).

A model plugin says what it takes with a class method `inputs(options, data) -> Inputs` on its `_target_`
(harness.rank.gpt.GPT does); one that says nothing takes images of `data.image_size` and `data.num_classes`
classes, as every torchvision classifier does. The loss is the same for every workload: cross-entropy over
the output's last dimension (a classifier's (N, classes) logits, a language model's (N, T, vocabulary)),
averaged over every target (each image, each token); a model may take it its own way with a method
`loss(outputs, targets)` (harness.rank.gpt.GPT with loss_chunks: the same value, in pieces), which `loss_for`
finds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from harness.core.checkpointing import split_model_options
from harness.core.config import DataConfig
from harness.core.options import HYDRA_KEYS

Batch = tuple[torch.Tensor, torch.Tensor]
REPEAT_NEXT = 0.8  # synthetic tokens: the share that follow the fixed next-token table (the rest are random)


@dataclass(frozen=True)
class Inputs:
    """`kind` images: (3, size, size) float inputs, one class id per sample. `kind` tokens: `shape[0]` token ids
    in, the next token of each position out. `factory` (data=custom): the user's function (n, generator) ->
    (inputs, targets) makes every batch instead, `kind` says what a sample counts as and `tokens` how many tokens
    one holds. `provided`: the keywords the harness passes the model factory."""

    kind: Literal["images", "tokens", "samples"]
    shape: tuple[int, ...] = ()
    classes: int = 0  # targets are ids below this: the classes, or the vocabulary
    provided: tuple[tuple[str, Any], ...] = ()  # hashable: the planner caches traces by it
    factory: str | None = None  # data=custom: the dotted path of the user's batch function
    tokens: int | None = None  # data=custom with sample=tokens: the tokens in one sample

    @property
    def tokens_per_sample(self) -> int | None:
        """A sequence's length, for tokens/s; None for images."""
        if self.factory is not None:
            return self.tokens
        return self.shape[0] if self.kind == "tokens" else None

    @property
    def image_size(self) -> int | None:
        """The side of the images the model is fed (its own, for a model that says so); None for other samples."""
        return self.shape[-1] if self.kind == "images" and self.factory is None else None

    @property
    def input_bytes(self) -> int:
        """One sample's input and target as the device holds them (fp32 pixels, int64 ids)."""
        if self.factory is not None:
            return sum(t.numel() * t.element_size() for t in self._draw(1, torch.Generator().manual_seed(0)))
        if self.kind == "tokens":
            return 2 * self.shape[0] * 8
        return 4 * self.shape[0] * self.shape[1] * self.shape[2] + 8

    def _draw(self, n: int, generator: torch.Generator) -> Batch:
        """One batch from the user's factory, checked: the harness relies on a pair of tensors of n samples."""
        import pydoc

        drawn = pydoc.locate(str(self.factory))(n, generator)  # type: ignore[misc]
        if not (isinstance(drawn, tuple | list) and len(drawn) == 2 and all(isinstance(t, torch.Tensor)
                                                                              for t in drawn)
                and all(t.shape[:1] == (n,) for t in drawn)):
            raise ValueError(f"data._target_={self.factory} returned {type(drawn).__name__}: a pair of tensors "
                             f"(inputs, targets), each with the {n} samples asked for in its first dimension, is needed")
        return drawn[0], drawn[1]

    def example(self, n: int, device: torch.device | str | None = None) -> Batch:
        """`n` random samples: what the planner traces and calibrates a step with (values do not matter)."""
        if self.factory is not None:
            x, y = self._draw(n, torch.Generator().manual_seed(0))
            return x.to(device), y.to(device)
        if self.kind == "tokens":
            return (torch.randint(0, self.classes, (n, *self.shape), device=device),
                    torch.randint(0, self.classes, (n, *self.shape), device=device))
        return torch.randn(n, *self.shape, device=device), torch.randint(0, self.classes, (n,), device=device)

    def batches(self, count: int, n: int, generator: torch.Generator) -> list[Batch]:
        """`count` learnable batches of `n` samples, drawn from `generator` on the CPU: images are their class's
        fixed random pattern plus noise; token sequences follow a fixed random next-token table
        (REPEAT_NEXT of the time) and are otherwise random, so the loss falls as on real data. data=custom: what
        the user's factory draws from `generator`."""
        if self.factory is not None:
            return [self._draw(n, generator) for _ in range(count)]
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


def inputs_of(model: Mapping[str, Any], data: DataConfig) -> Inputs:
    """What one sample is for this model on this data: the user's batches (data=custom); else what the model's
    `_target_` says with its `inputs(options, data)` (a class method, or an attribute of a factory function);
    else images of `data.image_size` and `data.num_classes` classes."""
    import pydoc

    if data.name == "custom":
        return Inputs(data.sample, factory=data.target, tokens=data.tokens_per_sample)
    declare = getattr(pydoc.locate(str(model["_target_"])), "inputs", None)
    if callable(declare):  # the factory's own options: not the harness's `checkpoint`
        options = split_model_options(model)[0]
        return declare({k: v for k, v in options.items() if k not in HYDRA_KEYS}, data)
    return images(data.image_size, data.num_classes)


def bound_options(factory: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """A model factory's options as given, the rest at its signature's defaults: what `inputs` reads."""
    import inspect

    bound = inspect.signature(factory).bind_partial(**options)
    bound.apply_defaults()
    return dict(bound.arguments)


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dimension, averaged over every target: a classifier's (N, C) logits against
    (N,) classes, a language model's (N, T, V) against (N, T) next tokens. Logits split by class across a
    tensor-parallel group (a DTensor: the strategy holds torch's loss_parallel) give a replicated loss, handed back as
    the plain tensor every rank holds."""
    from torch.distributed.tensor import DTensor

    value = F.cross_entropy(outputs.flatten(0, -2), targets.flatten())
    return value.to_local() if isinstance(value, DTensor) else value


def loss_for(model: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss a run takes for `model`: the model's own `loss(outputs, targets)` method where it defines one,
    looked for through the wrappers that hold it as `.module` (DistributedDataParallel, DataParallel, apex's DDP)
    or `._orig_mod` (torch.compile); else `loss`. The same value either way, by contract: a model's own loss
    changes how it is computed (memory), never what."""
    seen: set[int] = set()
    current: object = model
    while isinstance(current, torch.nn.Module) and id(current) not in seen:
        seen.add(id(current))
        own = getattr(current, "loss", None)
        if callable(own) and getattr(own, "__self__", None) is current:  # a bound method, not a submodule
            return own  # type: ignore[no-any-return]
        current = getattr(current, "module", None) or getattr(current, "_orig_mod", None)
    return loss
