"""The run's model built on the meta device and fed two samples, in the launching process, before any worker
starts: a factory that does not build, returns something other than a module, or a model the batch does not fit
(`model.name=vit_b_16` at 32 px) is refused in one line naming the key, not found by every rank after start-up.
The meta device holds no memory and computes nothing: this takes well under a second for a ResNet-101; a small
model steps on the CPU instead (`_device_for` says why)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from harness.core.errors import ConfigError
from harness.core.inputs import Inputs, loss_for
from harness.core.stops import last_line
from harness.plan.trace import hashable, on_meta

log = logging.getLogger(__name__)
SMALL_MODEL_BYTES = 64 * 2**20


def check_model(model: Mapping[str, Any], inputs: Inputs, image_size: int) -> nn.Module:
    """The model as built on the meta device (what a strategy may look at before launch: its blocks). Raises
    ConfigError naming `model._target_` (it does not build a module), the key its own factory named, or the input
    the model does not take (`data.image_size`, `data._target_`)."""
    return _check(hashable(model), inputs, image_size)


@functools.lru_cache(maxsize=64)
def _check(model: tuple[tuple[str, Any], ...], inputs: Inputs, image_size: int) -> nn.Module:
    options = {k: list(v) if isinstance(v, tuple) else v for k, v in model}
    target = options.get("_target_")
    try:
        built = on_meta(lambda: instantiate(options, **dict(inputs.provided)))
    except Exception as error:  # noqa: BLE001 (any factory's own error: named in one line)
        if isinstance(_root(error), ConfigError):  # the factory named the key itself (model.name=vit_b_17)
            raise _root(error) from error
        cause = _own_words(error)
        raise ConfigError("model._target_", target, f"a factory that builds a model from the options given "
                          f"({cause})") from error
    if not isinstance(built, nn.Module):
        raise ConfigError("model._target_", target, f"a class or function that returns a torch.nn.Module (it "
                          f"returned {type(built).__name__})")
    try:
        x, y = inputs.example(2, _device_for(built))
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001
        raise ConfigError("data._target_", inputs.factory, f"a batch factory that draws (inputs, targets) "
                          f"({_own_words(error)})") from error
    try:
        try:
            _step(built, x, y)
        except Exception:  # noqa: BLE001 (a model may keep tensors of its own on the meta device it was built on)
            if x.device.type == "meta":
                raise
            _step(built, *inputs.example(2, "meta"))  # the meta device's answer decides
    except NotImplementedError as error:  # an operator without a meta kernel: nothing can be said here
        log.debug("model check skipped: %s", last_line(error))
    except Exception as error:  # noqa: BLE001
        key, value = (("data._target_", inputs.factory) if inputs.factory else
                      ("data.image_size", image_size) if inputs.kind == "images" else ("model", target))
        raise ConfigError(key, value, f"a batch {options.get('name') or target} takes: a step on inputs of shape "
                          f"{tuple(x.shape)} with targets {tuple(y.shape)} fails ({_own_words(error)})") from error
    return built


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """One forward and loss, without gradients, on the device the inputs are on (`_device_for`)."""
    model.to_empty(device=x.device)
    try:
        with torch.no_grad():
            loss_for(model)(model.train()(x), y)
    finally:
        model.to_empty(device="meta")


def _device_for(model: nn.Module) -> str:
    """The CPU for a model whose weights fit in SMALL_MODEL_BYTES, stepped on uninitialised weights (shapes are
    checked, not values): the meta device's kernels are Python that a process imports at their first use, about
    1.5 s, longer than the whole check of a small model on the CPU. A larger model stays on the meta device, where
    it takes no memory."""
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return "cpu" if size <= SMALL_MODEL_BYTES else "meta"


def _root(error: BaseException) -> BaseException:
    """The factory's own error inside Hydra's InstantiationException."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def _own_words(error: BaseException) -> str:
    """The error's first line as its author wrote it."""
    cause = _root(error)
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"
