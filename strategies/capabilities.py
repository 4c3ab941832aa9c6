"""Optional capabilities of a strategy, as small mixins (Lightning's backward-sync control and sharding are
the model): a strategy has one by inheriting it, and the rank asks `isinstance`, never a strategy's name. A
strategy without one is run as if the capability had nothing to do (no sync to skip, nothing sharded,
nothing compiled inside the windows). A mixin comes before the base class in a strategy's bases
(`class FSDP2(ShardedParameters, ..., ProcessGroupStrategy)`): after it, a default of the base
(`Strategy.full_parameters`) would stand in for the mixin's abstract method, and a forgotten one would not
be caught."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from amp import Amp


class GradientSyncControl(ABC):
    """grad_accum: gradients accumulate locally and are communicated once per optimizer step."""

    @abstractmethod
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Entered around every micro-batch but the last of a step."""


class ShardedParameters(ABC):
    """Each rank holds a shard of the parameters, gathered a unit at a time (FSDP2)."""

    @abstractmethod
    def unit_names(self, model: nn.Module) -> list[str]:
        """The modules whose parameters are gathered one at a time (the planner traces their peaks)."""

    @abstractmethod
    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The trained parameters gathered whole (every rank must call it), as Strategy.full_parameters says."""


class CompilesInWindows(ABC):
    """Graphs compiled while the first iterations run (XLA): their time is reported apart."""

    @abstractmethod
    def compile_seconds(self) -> float | None:
        """Seconds this rank spent compiling, read after the timed loop; None: nothing compiled."""


class PipelineSchedule(ABC):
    """A model that runs a batch's forward and backward itself (a pipeline's schedule interleaves microbatches'
    forwards and backwards across the ranks' stages): the trainer hands it the batch instead of calling forward,
    the loss and backward. A capability of the model the strategy builds (strategy=pp's stages), since the trainer
    is handed the model."""

    @abstractmethod
    def forward_backward(self, batch: tuple[torch.Tensor, torch.Tensor], amp: Amp) -> torch.Tensor:
        """Forward and backward over `batch` inside the amp plugin's forward context, gradients left for the step;
        the batch's mean loss, detached, on every rank."""


def pipeline_schedule_of(model: nn.Module) -> PipelineSchedule | None:
    """The model's own schedule, looked for through the wrappers that hold it as `.module` (the amp plugin's
    CastingModule); None for a model the trainer drives."""
    seen: set[int] = set()
    current: object = model
    while isinstance(current, nn.Module) and id(current) not in seen:
        if isinstance(current, PipelineSchedule):
            return current
        seen.add(id(current))
        current = getattr(current, "module", None)
    return None


def no_sync_for(strategy: object, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """The strategy's gradient-sync skip around a micro-batch, or nothing where it has none."""
    if isinstance(strategy, GradientSyncControl):
        return strategy.no_sync(model)
    return contextlib.nullcontext()


def compile_seconds_of(strategy: object) -> float | None:
    return strategy.compile_seconds() if isinstance(strategy, CompilesInWindows) else None
