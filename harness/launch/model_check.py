"""The run's model built on the meta device and fed two samples, in the launching process, before any worker
starts: a factory that does not build, returns something other than a module, or a model the batch does not fit
(`model.name=vit_b_16` at 32 px) is refused in one line naming the key, not found by every rank after start-up.
The meta device holds no memory and computes nothing: this takes well under a second for a ResNet-101; a small
model steps on the CPU instead (`_device_for` says why). What the meta device cannot see, the values, is checked
on the two samples as drawn, the same on either device (`_checked_layers`, `_check_targets`): an id beyond an
embedding, a class id beyond the output, a dtype no amp level runs. A user's model given `model.checkpoint` must
name its blocks (harness.core.checkpointing). `raised_in_users_code` tells the planner's failure in the user's own
model code (a refusal) from its own (a warning)."""

from __future__ import annotations

import functools
import logging
import os
import re
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from harness.core.checkpointing import named_blocks, split_model_options
from harness.core.errors import ConfigError
from harness.core.inputs import Inputs, loss, loss_for
from harness.core.stops import last_line
from harness.prediction.trace import hashable, on_meta

log = logging.getLogger(__name__)
SMALL_MODEL_BYTES = 64 * 2**20


def check_model(model: Mapping[str, Any], inputs: Inputs, image_size: int) -> nn.Module:
    """The model as built on the meta device (what a strategy may look at before launch: its blocks). Raises
    ConfigError naming `model._target_` (it does not build a module), the key its own factory named, or the input
    the model does not take (`data.image_size`, `data._target_`)."""
    return _check(hashable(model), inputs, image_size)


@functools.lru_cache(maxsize=64)
def _check(model: tuple[tuple[str, Any], ...], inputs: Inputs, image_size: int) -> nn.Module:
    options, checkpoint = split_model_options({k: list(v) if isinstance(v, tuple) else v for k, v in model})
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
    if checkpoint != "none":  # the harness recomputes the blocks the model names: it must name them
        named_blocks(built, checkpoint, str(target))
    try:
        cpu_x, cpu_y = inputs.example(2, "cpu")  # drawn where values can be read: the checks below read them
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001
        raise ConfigError("data._target_", inputs.factory, f"a batch factory that draws (inputs, targets) "
                          f"({_own_words(error)})") from error
    fed = _Fed(cpu_x, cpu_y, cpu_x.to("meta"), cpu_y.to("meta"))
    x, y = (cpu_x, cpu_y) if _device_for(built) == "cpu" else (fed.meta_x, fed.meta_y)
    try:
        try:
            _step(built, x, y, fed)
        except BadBatch:
            raise
        except Exception as cpu_error:  # noqa: BLE001 (a model may keep tensors of its own on the meta device it was built on)
            if x.device.type == "meta":
                raise
            _step(built, fed.meta_x, fed.meta_y, fed)  # the meta device's answer decides, with the checks of values
            if isinstance(cpu_error, IndexError):  # but for an index the meta device cannot check: the batch's
                raise BadBatch(f"{_own_words(cpu_error)}, on the CPU with two samples") from cpu_error
            log.debug("model check: the CPU step failed, the meta step passed: %s", last_line(cpu_error))
    except NotImplementedError as error:  # an operator without a meta kernel: nothing can be said here
        log.debug("model check skipped: %s", last_line(error))
    except Exception as error:  # noqa: BLE001
        key, value = (("data._target_", inputs.factory) if inputs.factory else
                      ("data.image_size", image_size) if inputs.kind == "images" else ("model", target))
        name = options.get("name") or target
        if isinstance(error, BadBatch):
            raise ConfigError(key, value, f"a batch {name} takes ({error})") from error
        raise ConfigError(key, value, f"a batch {name} takes: a step on inputs of shape {tuple(x.shape)} with "
                          f"targets {tuple(y.shape)} fails ({_own_words(error)})") from error
    return built


class BadBatch(ValueError):
    """A batch the model cannot take, found where the meta device computes nothing to find it: an id out of an
    embedding's range, a target out of the classes, inputs of a dtype a layer cannot take. The message says
    what was fed and what is allowed."""


@dataclass(frozen=True)
class _Fed:
    """The two samples as drawn on the CPU and as moved to the meta device: a meta tensor's values are the CPU
    copy's, read where a layer is fed the batch itself or a view of it."""

    cpu_x: torch.Tensor
    cpu_y: torch.Tensor
    meta_x: torch.Tensor
    meta_y: torch.Tensor

    def values(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """`tensor`'s values: its own on a real device; on the meta device, the drawn batch's where `tensor` is
        it or a view of it; else None (computed inside the model: not known)."""
        if tensor.device.type != "meta":
            return tensor
        for meta, cpu in ((self.meta_x, self.cpu_x), (self.meta_y, self.cpu_y)):
            if tensor is meta:
                return cpu
            if tensor._base is meta and cpu.stride() == meta.stride():
                offset = tensor.storage_offset() - meta.storage_offset() + cpu.storage_offset()
                return cpu.as_strided(tensor.size(), tensor.stride(), offset)
        return None


WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)  # layers whose input must be of their weight's dtype
IGNORE_INDEX = -100  # cross-entropy's default: a target it skips


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, fed: _Fed) -> None:
    """One forward and loss, without gradients, on the device the inputs are on (`_device_for`), with the
    checks of values and dtypes the meta device does not make (BadBatch)."""
    model.to_empty(device=x.device)
    try:
        with torch.no_grad(), _checked_layers(model, fed):
            out = model.train()(x)
            take_loss = loss_for(model)
            if take_loss is loss and isinstance(out, torch.Tensor):
                _check_targets(out, y, fed)
            take_loss(out, y)
    finally:
        model.to_empty(device="meta")


@contextmanager
def _checked_layers(model: nn.Module, fed: _Fed) -> Iterator[None]:
    """Forward pre-hooks on every embedding (its ids' dtype and range) and every Linear and convolution (its
    input's dtype), removed after the step."""
    handles = []
    for path, module in model.named_modules():
        if isinstance(module, nn.Embedding | nn.EmbeddingBag):
            handles.append(module.register_forward_pre_hook(functools.partial(_check_ids, path, fed)))
        elif isinstance(module, WEIGHTED):
            handles.append(module.register_forward_pre_hook(functools.partial(_check_dtype, path)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _check_ids(path: str, fed: _Fed, module: nn.Embedding | nn.EmbeddingBag, args: tuple[Any, ...]) -> None:
    ids = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if ids is None:
        return
    kind = type(module).__name__
    if ids.dtype not in (torch.int64, torch.int32):
        raise BadBatch(f"RuntimeError: ids of {ids.dtype} for {path or 'the model'}, an nn.{kind}, which takes "
                       f"torch.int64 or torch.int32 ids")
    values = fed.values(ids)
    if values is None or values.numel() == 0:
        return
    low, high, size = int(values.min()), int(values.max()), module.num_embeddings
    if low < 0 or high >= size:
        bad = f"ids up to {high}" if high >= size else f"ids from {low}"
        raise BadBatch(f"IndexError: index out of range in self: {bad} for {path or 'the model'}, an nn.{kind} "
                       f"of {size} (ids 0 to {size - 1})")


def _check_dtype(path: str, module: nn.Module, args: tuple[Any, ...]) -> None:
    """Integers into a float layer, or float64 against another float: no amp level runs them (autocast casts
    neither). Half precision against float32 is left alone: autocast runs it at O1 and above."""
    x, weight = args[0] if args else None, getattr(module, "weight", None)
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and weight.is_floating_point()):
        return
    if x.dtype != weight.dtype and (not x.is_floating_point() or torch.float64 in (x.dtype, weight.dtype)):
        raise BadBatch(f"RuntimeError: inputs of {x.dtype} for {path or 'the model'}, an nn.{type(module).__name__} "
                       f"of {weight.dtype} weights: inputs of {weight.dtype} are needed")


def _check_targets(out: torch.Tensor, y: torch.Tensor, fed: _Fed) -> None:
    """The shared loss's targets (cross-entropy): class ids of torch.int64 below the output's last dimension (or
    its ignored -100). Float targets are class probabilities, whose shape the meta device checks."""
    if y.is_floating_point():
        return
    if y.dtype not in (torch.int64, torch.uint8):
        raise BadBatch(f"RuntimeError: targets of {y.dtype}: class ids of torch.int64 are needed")
    values = fed.values(y)
    if values is None or out.dim() == 0:
        return
    classes = out.shape[-1]
    kept = values[values != IGNORE_INDEX]
    if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= classes):
        low, high = int(kept.min()), int(kept.max())
        bad = f"targets up to {high}" if high >= classes else f"targets from {low}"
        raise BadBatch(f"IndexError: Target {high if high >= classes else low} is out of bounds: {bad} for an "
                       f"output of {classes} classes (ids 0 to {classes - 1})")


def _device_for(model: nn.Module) -> str:
    """The CPU for a model whose weights fit in SMALL_MODEL_BYTES, stepped on uninitialised weights (shapes are
    checked, not values): the meta device's kernels are Python that a process imports at their first use, about
    1.5 s, longer than the whole check of a small model on the CPU. A larger model stays on the meta device, where
    it takes no memory."""
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return "cpu" if size <= SMALL_MODEL_BYTES else "meta"


def _chain(error: BaseException) -> list[BaseException]:
    """The error and its causes, outermost first (Hydra's InstantiationException around the factory's error;
    a child process's error around the text of its traceback)."""
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 32:
        chain.append(chain[-1].__cause__)
    return chain


def _remote(error: BaseException) -> bool:
    """concurrent.futures' stand-in for a child process's traceback (its text only)."""
    return type(error).__name__ == "_RemoteTraceback"


def _root(error: BaseException) -> BaseException:
    """The factory's own error inside Hydra's InstantiationException (a child's error as re-raised here, not its
    traceback's text)."""
    return [e for e in _chain(error) if not _remote(e)][-1]


def _own_words(error: BaseException) -> str:
    """The error's first line as its author wrote it."""
    cause = _root(error)
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"


PROJECT_PACKAGES = ("harness", "strategies", "amp", "hydra_plugins")  # the shipped models are harness.rank's
_PROJECT_DIRS = tuple(str(Path(__file__).resolve().parents[2] / name) for name in PROJECT_PACKAGES)
LIBRARIES = ("torch", "torchvision")  # under every step, the planner's too: a `_target_` there is not the user's code
_REMOTE_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def users_model(model: Mapping[str, Any]) -> bool:
    """A model of the user's own (model=custom, or any `_target_` outside the harness's packages)."""
    return str(model.get("_target_", "")).partition(".")[0] not in PROJECT_PACKAGES


def raised_in_users_code(model: Mapping[str, Any], error: BaseException) -> str | None:
    """Where the user's own model code raised `error`, and its words (`at mymodels.py:12 in forward (ValueError:
    ...)`), where of the frames of the user's package and of the harness's the innermost is the user's. None for a
    shipped model, for an error the harness raised, and for a limit of the planner's trace (meta and fake tensors
    cannot do all a real step does: an operator without a meta kernel, a value read back): the run may work."""
    if not users_model(model):
        return None
    own = _root(error)
    if isinstance(own, NotImplementedError) or type(own).__module__.startswith("torch._subclasses") or \
            re.search(r"\b(meta|fake)\b", str(own), re.IGNORECASE):
        return None
    roots = _package_paths(str(model["_target_"]))
    for filename, line, function in reversed(_frames(error)):
        path = os.path.realpath(filename)
        if any(path == root or path.startswith(root + os.sep) for root in roots):
            return f"at {Path(filename).name}:{line} in {function} ({last_line(own)})"
        if path.startswith(_PROJECT_DIRS):
            return None
    return None


def _frames(error: BaseException) -> list[tuple[str, int, str]]:
    """Every frame of the error and its causes, outermost first; a child process's from its traceback's text."""
    frames: list[tuple[str, int, str]] = []
    for one in _chain(error):
        if _remote(one):
            frames += [(name, int(line), function) for name, line, function in _REMOTE_FRAME.findall(str(one))]
        else:
            frames += [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(one.__traceback__)]
    return frames


def _package_paths(target: str) -> list[str]:
    """The files of the user's top-level package (or module) that `target` is in (none for torch's own
    classes, `model._target_=torch.nn.Linear`: torch's frames are under every step)."""
    import importlib
    import pydoc

    located = pydoc.locate(target)
    names = {target.partition(".")[0], str(getattr(located, "__module__", "") or "").partition(".")[0]} - \
        {"", *LIBRARIES}
    paths: list[str] = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 (not importable here: no frame is known to be its)
            continue
        found = list(getattr(module, "__path__", None) or [getattr(module, "__file__", None) or ""])
        paths += [os.path.realpath(p) for p in found if p]
    return [p for p in paths if not p.startswith(_PROJECT_DIRS)]
