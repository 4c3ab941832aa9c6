"""A stand-in for NVIDIA apex 25.05's `apex.amp` and `apex.parallel.DistributedDataParallel`, as strict as apex
where the harness meets them. Written from apex's source, not copied: each behaviour names the line it mirrors
as `file:line` under apex/ at tag 25.05 (https://github.com/NVIDIA/apex/tree/25.05/apex).

amp (`amp.initialize`, `amp.scale_loss`, `amp._amp_state`):
- the options are checked as amp/frontend.py's `Properties.__setattr__` checks them (:53-99): at O1,
  keep_batchnorm_fp32, master_weights or a cast_model_type other than float32 raise RuntimeError with apex's
  message (`warn_or_err`, amp/_amp_state.py:19-23; no hard_override);
- the model is refused if it is already wrapped in torch's DDP or DataParallel (amp/_initialize.py:66-78) or
  has half parameters or buffers (:81-118);
- where the level has a cast_model_type (O0: float32, O2/O3: float16; amp/frontend.py:116, :139, :180) the
  model is cast (amp/_initialize.py:178-184; with keep_batchnorm_fp32 by apex/fp16_utils/fp16util.py:60-70,
  which leaves affine batch norms in float32) and its forward replaced by one that casts floating inputs to
  that type and outputs to float32 (amp/_initialize.py:186-203);
- the optimizer is patched as amp/_process_optimizer.py:321-489 does: once only, with fp32 master weights
  swapped into its param_groups at its first zero_grad or backward (:28-90), copied back to the model after
  each step (:353-364), an argument-less zero_grad that zeroes the model's gradients in place (:366-382);
- `scale_loss` scales, unscales into the masters and skips a step on overflow as amp/handle.py:17-158 and
  amp/scaler.py (its Python path, :6-30, :76-217) do: dynamic scaling starts at 2**16.

DistributedDataParallel: the constructor arguments, refusals, the broadcast from rank 0, the buckets and the
averaged all-reduce of apex/parallel/distributed.py:131-643 (see the class).

Where it departs from apex, so that it runs on a CPU: tensors are bucketed by their type as if on CUDA
(`torch.HalfTensor` counts as apex's "torch.cuda.HalfTensor"); nothing is checked to be on CUDA
(amp/_initialize.py:90-95, :113-118 would refuse a CPU model), no CUDA stream, event or fused kernel is made
(parallel/distributed.py:230, amp/scaler.py:56); O1's patching of torch functions (amp/_initialize.py:235-248)
is not done: an O1 model runs in float32. Options the harness does not use raise NotImplementedError rather
than being half imitated.
"""

from __future__ import annotations

import contextlib
import math
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

HALF, FLOAT, DOUBLE = "torch.cuda.HalfTensor", "torch.cuda.FloatTensor", "torch.cuda.DoubleTensor"


def cuda_type(tensor: torch.Tensor) -> str:
    """`tensor.type()` as apex's tables spell it on a GPU (the only place apex runs)."""
    name = tensor.type()
    return name if tensor.is_cuda else name.replace("torch.", "torch.cuda.", 1)


# ---- apex.amp -------------------------------------------------------------------------------------------------

# amp/frontend.py:104-187, classes O3, O2, O1, O0: each sets these properties through Properties.__setattr__.
LEVEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "O3": dict(cast_model_type=torch.float16, patch_torch_functions=False, keep_batchnorm_fp32=False,
               master_weights=False, loss_scale=1.0),
    "O2": dict(cast_model_type=torch.float16, patch_torch_functions=False, keep_batchnorm_fp32=True,
               master_weights=True, loss_scale="dynamic"),
    "O1": dict(cast_model_type=None, patch_torch_functions=True, keep_batchnorm_fp32=None,
               master_weights=None, loss_scale="dynamic"),
    "O0": dict(cast_model_type=torch.float32, patch_torch_functions=False, keep_batchnorm_fp32=None,
               master_weights=False, loss_scale=1.0),
}


def _refuse(message: str) -> None:
    """amp/_amp_state.py:19-23, `warn_or_err`: `raise RuntimeError(msg)` (hard_override is never set)."""
    raise RuntimeError(message)


class Properties:
    """amp/frontend.py:9-99: the options, each checked against the opt_level as it is set (:53-99)."""

    def __init__(self) -> None:
        self.options: dict[str, Any] = dict(enabled=False, opt_level=None, cast_model_type=None,
                                            patch_torch_functions=False, keep_batchnorm_fp32=None,
                                            master_weights=None, loss_scale=1.0)  # :16-27

    def __getattr__(self, name: str) -> Any:
        options = self.__dict__.get("options", {})
        if name in options:
            return options[name]
        raise AttributeError(name)

    def set(self, name: str, value: Any) -> None:
        level = self.options["opt_level"]
        if name == "cast_model_type":  # :57-66
            if level == "O1" and value is not None and value is not False and value is not torch.float32:
                _refuse("O1 inserts casts around Torch functions rather than model weights, so with O1, the model "
                        "weights themselves should remain FP32. If you wish to cast the model to a different type, "
                        f"use opt_level='O2' or 'O3'. cast_model_type was {value}")
        elif name == "patch_torch_functions":  # :67-71
            if level != "O1" and value:
                _refuse("Currently, patch_torch_functions=True should only be set by selecting opt_level='O1'.")
        elif name == "keep_batchnorm_fp32":  # :72-85
            if level == "O1" and value is not None:
                _refuse("With opt_level O1, batchnorm functions are automatically patched to run in FP32, so "
                        f"keep_batchnorm_fp32 should be None. keep_batchnorm_fp32 was {value}")
            value = {"True": True, "False": False}.get(value, value) if isinstance(value, str) else value
            assert value is True or value is False or value is None, (
                "keep_batchnorm_fp32 must be a boolean, the string 'True' or 'False', or None, found "
                f"keep_batchnorm_fp32={value}")
        elif name == "master_weights":  # :86-90
            if level == "O1" and value is not None:
                _refuse("It doesn't make sense to use master_weights with O1. With O1, your model weights "
                        "themselves should be FP32.")
        elif name == "loss_scale":  # :91-95
            value = value if value == "dynamic" else float(value)
        self.options[name] = value


def _cast(dtype: torch.dtype, value: Any) -> Any:
    """amp/_initialize.py:23-37, `to_type`: floating tensors (and custom batches with a `to`) to `dtype`."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    return value.to(dtype)


def _apply(value: Any, fn: Callable[[Any], Any]) -> Any:
    """amp/_initialize.py:41-63, `applier`: `fn` over the tensors in nested arguments and outputs."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, str | np.ndarray):
        return value
    if hasattr(value, "to"):
        return fn(value)
    if isinstance(value, Mapping):
        return {_apply(k, fn): _apply(v, fn) for k, v in value.items()}
    if isinstance(value, Iterable):
        return type(value)(_apply(v, fn) for v in value)  # type: ignore[call-arg]
    return value


def _check_models(models: list[nn.Module]) -> None:
    """amp/_initialize.py:66-78. Its apex DDP test (`'apex_DDP' in sys.modules`, :71) never holds: sys.modules
    has no such key, so apex lets a model wrapped in its own DDP through, and so does this."""
    for model in models:
        kind = ("torch.nn.parallel.DistributedDataParallel" if isinstance(model, nn.parallel.DistributedDataParallel)
                else "torch.nn.parallel.DataParallel" if isinstance(model, nn.DataParallel) else None)
        if kind is not None:
            raise RuntimeError(f"Incoming model is an instance of {kind}. Parallel wrappers should only be applied "
                               "to the model(s) AFTER \nthe model(s) have been returned from amp.initialize.")


def _check_params_fp32(models: list[nn.Module]) -> None:
    """amp/_initialize.py:81-118, the half half of it (:85-89, :108-112); the CUDA half is left out (above)."""
    for model in models:
        for what, named in (("param", model.named_parameters()), ("buffer", model.named_buffers())):
            for name, tensor in named:
                if tensor.is_floating_point() and "Half" in tensor.type():
                    _refuse(f"Found {what} {name} with type {tensor.type()}, expected torch.cuda.FloatTensor.\n"
                            "When using amp.initialize, you do not need to call .half() on your model\n"
                            "before passing it, no matter what optimization level you choose.")


def _convert_network(model: nn.Module, dtype: torch.dtype) -> None:
    """apex/fp16_utils/fp16util.py:60-70 (`convert_network`, with `convert_module` at :44-57): every module's own
    floating parameters (and their gradients) and buffers to `dtype`, except affine batch norms'."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.affine is True:
            continue
        for param in module.parameters(recurse=False):
            if param.dtype.is_floating_point:
                param.data = param.data.to(dtype)
            if param.grad is not None and param.grad.dtype.is_floating_point:
                param.grad.data = param.grad.data.to(dtype)
        for buf in module.buffers(recurse=False):
            if buf.dtype.is_floating_point:
                buf.data = buf.data.to(dtype)


def _state_dict_in_float32(module: nn.Module, state_dict: dict[str, Any], prefix: str, metadata: Any) -> None:
    """amp/_initialize.py:135-144 (`O2StateDictHook`), registered on every module at :210-212."""
    for key, value in state_dict.items():
        if "Half" in value.type():
            state_dict[key] = value.to(torch.float32)


class _LossScaler:
    """amp/scaler.py:33-217 on its Python path (apex built without --cuda_ext)."""

    def __init__(self, loss_scale: Any, min_loss_scale: float | None, max_loss_scale: float) -> None:
        self.dynamic = loss_scale == "dynamic"  # :45-50, init_scale=2.**16 (:40)
        self._loss_scale = min(max_loss_scale, 2.0 ** 16) if self.dynamic else loss_scale
        self._min_loss_scale, self._max_loss_scale = min_loss_scale, max_loss_scale
        self._scale_seq_len, self._unskipped, self._has_overflow = 2000, 0, False  # scale_window (:42)

    def loss_scale(self) -> float:
        return self._loss_scale

    def _overflows(self, grad: torch.Tensor) -> bool:
        """:8-11 and :21-24, checked only with dynamic scaling."""
        return self.dynamic and not math.isfinite(float(grad.float().sum()))

    def unscale(self, model_grads: list[torch.Tensor], master_grads: list[torch.Tensor], unused_scale: Any,
                models_are_masters: bool = False, scale_override: float | None = None) -> None:
        """:94-119 with `unscale_python` (:76-91) and `scale_check_overflow_python` (:6-17)."""
        if self._has_overflow:
            return
        scale = self._loss_scale if scale_override is None else scale_override
        if scale == 1.0 and models_are_masters and not self.dynamic:
            return
        for model, master in zip(model_grads, master_grads, strict=True):
            if model is None:
                continue
            self._has_overflow = self._overflows(model)
            if self._has_overflow:
                break
            if master is not model:
                master.copy_(model)
            if 1.0 / scale != 1.0:
                master.mul_(1.0 / scale)

    def unscale_with_stashed(self, model_grads: list[torch.Tensor], stashed: list[torch.Tensor],
                             master_grads: list[torch.Tensor],
                             scale_override: tuple[float, float, float] | None = None) -> None:
        """:152-184 with `unscale_with_stashed_python` (:126-150) and `axpby_check_overflow_python` (:19-30)."""
        if self._has_overflow:
            return
        grads_have, stashed_have, out = scale_override or (self._loss_scale, 1.0, 1.0)
        for model, stash, master in zip(model_grads, stashed, master_grads, strict=True):
            if model is None and stash is None:
                continue
            self._has_overflow = self._overflows(model)
            if self._has_overflow:
                break
            master.data = (out / grads_have) * model.data.to(master.dtype) + (out / stashed_have) * stash.data

    def clear_overflow_state(self) -> None:  # :191-194
        self._has_overflow = False

    def update_scale(self) -> bool:
        """:197-217: an overflow halves a dynamic scale (down to min_loss_scale) and skips the step; 2000 steps
        without one double it (up to max_loss_scale)."""
        should_skip = self._has_overflow and self.dynamic
        if should_skip:
            halved = self._loss_scale / 2.0
            self._loss_scale = max(self._min_loss_scale, halved) if self._min_loss_scale else halved
            self._unskipped = 0
        else:
            self._unskipped += 1
        if self._unskipped == self._scale_seq_len and self.dynamic:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * 2.0)
            self._unskipped = 0
        return should_skip


def _unsupported_type(param: torch.Tensor) -> TypeError:
    return TypeError("Optimizer's parameters must be either torch.cuda.FloatTensor or torch.cuda.HalfTensor. "
                     f"Received {param.type()}")  # amp/_process_optimizer.py:57-60, :215-218


def _lazy_init_with_master_weights(self: torch.optim.Optimizer) -> None:
    """amp/_process_optimizer.py:28-90: each half parameter that requires a gradient is replaced in the
    param_groups by an fp32 master (:44-47), its optimizer state moved to it (:50-51)."""
    stash = self._amp_stash
    stash.all_fp16_params, stash.all_fp32_from_fp16_params, stash.all_fp32_from_fp32_params = [], [], []
    for group in self.param_groups:
        for i, param in enumerate(group["params"]):
            if not param.requires_grad:
                continue
            if cuda_type(param) == HALF:
                master = param.detach().clone().float()
                master.requires_grad = True
                group["params"][i] = master
                stash.all_fp16_params.append(param)
                stash.all_fp32_from_fp16_params.append(master)
                if param in self.state:
                    self.state[master] = self.state.pop(param)
            elif cuda_type(param) == FLOAT:
                stash.all_fp32_from_fp32_params.append(param)
            else:
                raise _unsupported_type(param)
    stash.all_fp32_from_fp32_grad_stash = [None for _ in stash.all_fp32_from_fp32_params]  # :81
    for param in stash.all_fp32_from_fp16_params + stash.all_fp32_from_fp32_params:  # :83-87
        param.grad = None
    self.load_state_dict(self.state_dict())  # :90, recasts the per-parameter state


def _lazy_init_no_master_weights(self: torch.optim.Optimizer) -> None:
    """amp/_process_optimizer.py:205-221."""
    stash = self._amp_stash
    stash.all_fp16_params, stash.all_fp32_params = [], []
    for group in self.param_groups:
        for param in group["params"]:
            kind = cuda_type(param)
            if kind not in (HALF, FLOAT):
                raise _unsupported_type(param)
            (stash.all_fp16_params if kind == HALF else stash.all_fp32_params).append(param)
    stash.all_fp16_grad_stash = [None for _ in stash.all_fp16_params]
    stash.all_fp32_grad_stash = [None for _ in stash.all_fp32_params]


def _amp_lazy_init(self: torch.optim.Optimizer) -> None:
    """amp/_process_optimizer.py:313-318."""
    if not self._amp_stash.lazy_init_called:
        self._lazy_init_maybe_master_weights()
        self._amp_stash.lazy_init_called = True


def _post_backward_models_are_masters(scaler: _LossScaler, params: list[nn.Parameter], stashed: list[Any]) -> None:
    """amp/_process_optimizer.py:93-139 (no scale_override): each gradient unscaled in place, plus what was
    stashed before the backward; with a static scale of 1 the stash is dropped (:97-101)."""
    if scaler.loss_scale() == 1.0 and not scaler.dynamic:
        stashed[:] = [None] * len(stashed)
        return
    alone, with_stash, stash_of = [], [], []
    for param, stash in zip(params, stashed, strict=True):
        if param.grad is None and stash is not None:
            param.grad = stash
        elif param.grad is not None and stash is None:
            alone.append(param.grad)
        elif param.grad is not None:
            with_stash.append(param.grad)
            stash_of.append(stash)
    if alone:
        scaler.unscale(alone, alone, None, models_are_masters=True, scale_override=scaler.loss_scale())
    if with_stash:
        scaler.unscale_with_stashed(with_stash, stash_of, with_stash, scale_override=(scaler.loss_scale(), 1.0, 1.0))
    stashed[:] = [None] * len(stashed)


def _prepare_backward_with_master_weights(self: torch.optim.Optimizer) -> None:
    """amp/_process_optimizer.py:142-158."""
    stash = self._amp_stash
    self._amp_lazy_init()
    for param in stash.all_fp16_params:
        param.grad = None
    for i, param in enumerate(stash.all_fp32_from_fp32_params):
        stash.all_fp32_from_fp32_grad_stash[i] = param.grad
        param.grad = None


def _post_backward_with_master_weights(self: torch.optim.Optimizer, scaler: _LossScaler) -> None:
    """amp/_process_optimizer.py:161-202: the half gradients unscaled into the masters' fp32 gradients (made at
    :176), the fp32 parameters' as :93-139."""
    stash = self._amp_stash
    self._amp_lazy_init()
    new_from, new_to, stashed_from, stashed_to = [], [], [], []
    for half, master in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params, strict=True):
        if half.grad is not None and master.grad is None:
            master.grad = torch.empty_like(master)
            new_from.append(half.grad)
            new_to.append(master.grad)
        elif half.grad is not None:
            stashed_from.append(half.grad)
            stashed_to.append(master.grad)
    if new_from:
        scaler.unscale(new_from, new_to, scaler.loss_scale(), models_are_masters=False)
    if stashed_from:
        scaler.unscale_with_stashed(stashed_from, stashed_to, stashed_to)
    _post_backward_models_are_masters(scaler, stash.all_fp32_from_fp32_params, stash.all_fp32_from_fp32_grad_stash)


def _prepare_backward_no_master_weights(self: torch.optim.Optimizer) -> None:
    """amp/_process_optimizer.py:224-237."""
    stash = self._amp_stash
    self._amp_lazy_init()
    for params, stashed in ((stash.all_fp16_params, stash.all_fp16_grad_stash),
                            (stash.all_fp32_params, stash.all_fp32_grad_stash)):
        for i, param in enumerate(params):
            stashed[i] = param.grad
            param.grad = None


def _post_backward_no_master_weights(self: torch.optim.Optimizer, scaler: _LossScaler) -> None:
    """amp/_process_optimizer.py:240-249."""
    stash = self._amp_stash
    self._amp_lazy_init()
    _post_backward_models_are_masters(scaler, stash.all_fp16_params, stash.all_fp16_grad_stash)
    _post_backward_models_are_masters(scaler, stash.all_fp32_params, stash.all_fp32_grad_stash)


def _process_optimizer(optimizer: torch.optim.Optimizer, master_weights: bool) -> torch.optim.Optimizer:
    """amp/_process_optimizer.py:321-489 for torch.optim optimizers (not apex's FusedSGD); add_param_group
    (:411-487) is left as it is."""
    if hasattr(optimizer, "_amp_stash"):  # :322-323
        raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")
    optimizer._amp_stash = types.SimpleNamespace(lazy_init_called=False, already_patched=False,
                                                 params_have_scaled_gradients=False)
    for name in ("_lazy_init_maybe_master_weights", "_master_params_to_model_params", "_prepare_amp_backward",
                 "_post_amp_backward", "_amp_lazy_init"):  # :331-337
        if hasattr(optimizer, name):
            raise RuntimeError(f"Incoming optimizer already has {name} defined.")

    def bind(fn: Callable[..., Any]) -> Any:
        return types.MethodType(fn, optimizer)

    if not master_weights:  # :394-407
        optimizer._lazy_init_maybe_master_weights = bind(_lazy_init_no_master_weights)
        optimizer._prepare_amp_backward = bind(_prepare_backward_no_master_weights)
        optimizer._post_amp_backward = bind(_post_backward_no_master_weights)
        optimizer._amp_lazy_init = bind(_amp_lazy_init)
        return optimizer

    optimizer._lazy_init_maybe_master_weights = bind(_lazy_init_with_master_weights)  # :347-348

    def master_params_to_model_params(self: torch.optim.Optimizer) -> None:  # :14-25 (fp16util.py:173-174)
        for half, master in zip(self._amp_stash.all_fp16_params, self._amp_stash.all_fp32_from_fp16_params,
                                strict=True):
            half.data.copy_(master.data)

    old_step = optimizer.step

    def new_step(self: torch.optim.Optimizer, closure: Any = None) -> Any:  # :353-364
        if closure is not None:
            raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
        result = old_step()
        self._master_params_to_model_params()
        for master in self._amp_stash.all_fp32_from_fp16_params:
            master.grad = None
        return result

    def new_zero_grad(self: torch.optim.Optimizer) -> None:  # :366-382: no set_to_none argument
        stash = self._amp_stash
        self._amp_lazy_init()
        for param in stash.all_fp16_params + stash.all_fp32_from_fp32_params:
            if param.grad is not None:
                param.grad.detach_()
                param.grad.zero_()
        for master in stash.all_fp32_from_fp16_params:
            master.grad = None

    optimizer._master_params_to_model_params = bind(master_params_to_model_params)
    optimizer.step = bind(new_step)
    optimizer.zero_grad = bind(new_zero_grad)
    optimizer._prepare_amp_backward = bind(_prepare_backward_with_master_weights)  # :390-393
    optimizer._post_amp_backward = bind(_post_backward_with_master_weights)
    optimizer._amp_lazy_init = bind(_amp_lazy_init)  # :409
    return optimizer


class FakeAmp:
    """`apex.amp`'s two entry points over one `_amp_state` (amp/_amp_state.py:8-16)."""

    def __init__(self) -> None:
        self._amp_state = types.SimpleNamespace(hard_override=False, allow_incoming_model_not_fp32=False,
                                                verbosity=1, loss_scalers=[])

    def initialize(self, models: Any, optimizers: Any = None, enabled: bool = True, opt_level: str = "O1",
                   cast_model_type: Any = None, patch_torch_functions: Any = None, keep_batchnorm_fp32: Any = None,
                   master_weights: Any = None, loss_scale: Any = None, cast_model_outputs: Any = None,
                   num_losses: int = 1, verbosity: int = 1, min_loss_scale: float | None = None,
                   max_loss_scale: float = 2.0 ** 24) -> Any:
        """amp/frontend.py:197-362: apex's keywords (another raises TypeError, as there)."""
        state = self._amp_state
        state.opt_properties, state.verbosity = Properties(), verbosity  # :312-313
        if not enabled:  # :315-319
            return models if optimizers is None else (models, optimizers)
        if not torch.backends.cudnn.enabled:  # :321-323
            raise RuntimeError("Amp requires torch.backends.cudnn.enabled = True")
        if opt_level not in LEVEL_DEFAULTS:  # :325-329
            raise RuntimeError(f"Unexpected optimization level {opt_level}. Options are 'O0', 'O1', 'O2', 'O3'.  Note "
                               "that in `O0`, `O1`, etc., the prefix O is the letter O, not the number zero.")
        props = state.opt_properties
        props.set("enabled", True)  # the level's defaults (:331; frontend.py:113-187), checked like overrides
        props.set("opt_level", opt_level)
        for name, value in LEVEL_DEFAULTS[opt_level].items():
            props.set(name, value)
        state.min_loss_scale, state.max_loss_scale = min_loss_scale, max_loss_scale  # :337-338
        overrides = dict(enabled=enabled, opt_level=opt_level, cast_model_type=cast_model_type,
                         patch_torch_functions=patch_torch_functions, keep_batchnorm_fp32=keep_batchnorm_fp32,
                         master_weights=master_weights, loss_scale=loss_scale)
        for name, value in overrides.items():  # :343-356, in this order; None is no override
            if value is not None:
                props.set(name, value)
        return self._initialize(models, optimizers, props, num_losses, cast_model_outputs)

    def _initialize(self, models: Any, optimizers: Any, props: Properties, num_losses: int,
                    cast_model_outputs: Any) -> Any:
        """amp/_initialize.py:147-265."""
        optimizers_was_list = isinstance(optimizers, list)  # :150-160
        if isinstance(optimizers, torch.optim.Optimizer):
            optimizers = [optimizers]
        elif optimizers is None:
            optimizers = []
        elif not optimizers_was_list:
            raise TypeError("optimizers must be either a single optimizer or a list of optimizers.")
        models_was_list = isinstance(models, list)  # :162-168
        if isinstance(models, nn.Module):
            models = [models]
        elif not models_was_list:
            raise TypeError("models must be either a single model or a list of models.")
        _check_models(models)  # :170
        _check_params_fp32(models)  # :172-173

        if props.cast_model_type:  # :178-212
            for model in models:
                if props.keep_batchnorm_fp32:
                    _convert_network(model, props.cast_model_type)
                else:
                    model.to(props.cast_model_type)
            self._patch_forward(models, props.cast_model_type, cast_model_outputs or torch.float32)
            for optimizer in optimizers:  # :206-207
                optimizer.load_state_dict(optimizer.state_dict())
            for model in models:
                for module in model.modules():
                    module._register_state_dict_hook(_state_dict_in_float32)
        elif cast_model_outputs is not None:  # :214-224
            self._patch_forward(models, None, cast_model_outputs)

        optimizers = [_process_optimizer(o, bool(props.master_weights)) for o in optimizers]  # :226-227
        self._amp_state.loss_scalers = [_LossScaler(props.loss_scale, self._amp_state.min_loss_scale,
                                                    self._amp_state.max_loss_scale)
                                        for _ in range(num_losses)]  # :229-233
        returned_models = models if models_was_list else models[0]  # :250-265
        if optimizers_was_list:
            return returned_models, optimizers
        return (returned_models, optimizers[0]) if optimizers else returned_models

    @staticmethod
    def _patch_forward(models: list[nn.Module], input_type: torch.dtype | None, output_type: torch.dtype) -> None:
        """amp/_initialize.py:196-203 (and :218-224 for outputs alone): `model.forward = patch_forward(
        model.forward)`, a closure over the forward bound to *this* module, which replicas made from it (torch's
        DataParallel) keep calling."""
        for model in models:
            model.forward = _patched_forward(model.forward, input_type, output_type)

    @contextlib.contextmanager
    def scale_loss(self, loss: torch.Tensor, optimizers: Any, loss_id: int = 0, model: Any = None,
                   delay_unscale: bool = False, delay_overflow_check: bool = False) -> Iterator[torch.Tensor]:
        """amp/handle.py:17-158 (delay_unscale is not imitated)."""
        state = self._amp_state
        if not hasattr(state, "opt_properties"):  # :81-84
            raise RuntimeError("Invoked 'with amp.scale_loss`, but internal Amp state has not been initialized.  "
                               "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be called "
                               "before `with amp.scale_loss`.")
        if not state.opt_properties.enabled:  # :86-88
            yield loss
            return
        if delay_unscale:
            raise NotImplementedError("fake apex: scale_loss(delay_unscale=True)")
        optimizers = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else optimizers  # :90-91
        scaler = state.loss_scalers[loss_id]
        if not state.opt_properties.master_weights and not scaler.dynamic and scaler.loss_scale() == 1.0:
            yield loss.float()  # :96-105: nothing to scale or copy
            return
        for optimizer in optimizers:  # :107-111
            if not optimizer._amp_stash.params_have_scaled_gradients:
                optimizer._prepare_amp_backward()
        yield loss.float() * scaler.loss_scale()  # :113
        scaler.clear_overflow_state()  # :121-124
        for optimizer in optimizers:
            optimizer._post_amp_backward(scaler)
            optimizer._amp_stash.params_have_scaled_gradients = False
        if not delay_overflow_check and scaler.update_scale():  # :127-154: the next step() is skipped
            for optimizer in optimizers:
                if not optimizer._amp_stash.already_patched:
                    _skip_next_step(optimizer)


def _patched_forward(old_forward: Callable[..., Any], input_type: torch.dtype | None,
                     output_type: torch.dtype) -> Callable[..., Any]:
    """amp/_initialize.py:196-201: floating inputs cast to the model's type (none for outputs alone, :218-222),
    the output to float32 or cast_model_outputs (:187-190)."""
    def new_forward(*args: Any, **kwargs: Any) -> Any:
        if input_type is not None:
            args, kwargs = (_apply(a, lambda t: _cast(input_type, t)) for a in (args, kwargs))
        return _apply(old_forward(*args, **kwargs), lambda t: _cast(output_type, t))

    return new_forward


def _skip_next_step(optimizer: torch.optim.Optimizer) -> None:
    """amp/handle.py:133-154: step() does nothing once but drop the master gradients, then is itself again."""
    step = optimizer.step

    def skip_step(closure: Any = None) -> None:
        if closure is not None:
            raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
        for master in getattr(optimizer._amp_stash, "all_fp32_from_fp16_params", []):
            master.grad = None
        optimizer.step = step
        optimizer._amp_stash.already_patched = False

    optimizer.step = skip_step
    optimizer._amp_stash.already_patched = True


# ---- apex.parallel ----------------------------------------------------------------------------------------------

def _buckets_by_type(tensors: Iterable[torch.Tensor], types_: tuple[str, ...] | None = None) -> list[list[torch.Tensor]]:
    """parallel/distributed.py:62-69 (`split_by_type`, every type, in order of appearance) or, given `types_`,
    :53-60 (`split_half_float_double`: only those, in that order; a bfloat16 gradient is in no bucket)."""
    buckets: dict[str, list[torch.Tensor]] = {}
    for tensor in tensors:
        buckets.setdefault(cuda_type(tensor), []).append(tensor)
    return list(buckets.values()) if types_ is None else [buckets[t] for t in types_ if t in buckets]


class DistributedDataParallel(nn.Module):
    """apex/parallel/distributed.py:131-643. Refuses as apex does: without an initialized default process group
    (`dist.get_backend()`, :186), `shared_param` (:210-211), `delay_allreduce` with `allreduce_trigger_params`
    (:221-223) or with several streams (:207-208), NCCL with parameters off the GPU (:239-241). Broadcasts the
    parameters from rank 0 (:257). Hooks every parameter that requires a gradient (:355-412); each backward
    all-reduces the gradients and multiplies them by 1/world_size (`gradient_average`, :457-458):
    - delay_allreduce: once, at the end of the backward (:328-336), in one flat bucket per type among half, float
      and double (:495-514, :53-60; gradients of other types are silently left out);
    - otherwise the first backward after the parameters change (`needs_refresh`, :577-580) builds buckets in the
      order gradients arrive, a bucket closed once it holds `message_size` elements (:385-394), broadcasts rank
      0's buckets (:287-320) and reduces as delay_allreduce does; later backwards all-reduce each bucket as soon
      as it is full and every bucket before it has gone (:517-560), and check at the end that all went (:339-352).
      A parameter type outside the three is a KeyError at that first backward (`param_type_to_tmp_i`, :376).
    `allreduced` records each all-reduce as (type, number of gradients) for the tests."""

    def __init__(self, module: nn.Module, message_size: int = 10000000, delay_allreduce: bool = False,
                 shared_param: Any = None, allreduce_trigger_params: Any = None, retain_allreduce_buffers: bool = False,
                 allreduce_always_fp32: bool = False, num_allreduce_streams: int = 1, allreduce_communicators: Any = None,
                 gradient_average: bool = True, gradient_predivide_factor: float = 1.0,
                 gradient_average_split_factor: Any = None, prof: bool = False) -> None:  # :164-177
        super().__init__()
        self._backend = dist.get_backend()  # :186
        if num_allreduce_streams > 1 and delay_allreduce:  # :207-208
            raise ValueError("self.allreduce_different_streams may only be used if delay_allreduce=False.")
        if shared_param is not None:  # :210-211
            raise ValueError("shared_param is no longer supported as an option.  It was misleadingly named from the "
                             "start.  It turns out overlapping communication with computation should work fine with "
                             "shared parameters.  If you still wish to delay communication to the end of the backward "
                             "pass, use delay_allreduce=True|False instead.")
        if allreduce_trigger_params is not None and delay_allreduce:  # :221-223
            raise ValueError("Setting allreduce_trigger_params is only valid if delay_allreduce=False.")
        for name, value, default in (("allreduce_trigger_params", allreduce_trigger_params, None),
                                     ("retain_allreduce_buffers", retain_allreduce_buffers, False),
                                     ("num_allreduce_streams", num_allreduce_streams, 1),
                                     ("allreduce_communicators", allreduce_communicators, None), ("prof", prof, False)):
            if value != default:
                raise NotImplementedError(f"fake apex DistributedDataParallel: {name}={value!r}")
        self.world_size = float(dist.get_world_size())  # :213
        self.allreduce_always_fp32, self.gradient_average = allreduce_always_fp32, gradient_average  # :216-218
        self.gradient_predivide_factor = gradient_predivide_factor
        self.delay_allreduce, self.message_size = delay_allreduce, message_size  # :227-228
        self.module = module  # :235
        self._disable_allreduce = False  # :237
        if self._backend == dist.Backend.NCCL:  # :239-241
            for param in self.module.parameters():
                assert param.is_cuda, "NCCL backend only supports model parameters to be on GPU."
        self.active_params: list[nn.Parameter] = []  # :243
        self.param_type_to_tmp_i = {HALF: 0, FLOAT: 1, DOUBLE: 2}  # :245-247
        self.allreduced: list[tuple[str, int]] = []
        for param in self.module.parameters():  # :355-412: after the gradient is accumulated
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._allreduce_hook)
        for bucket in _buckets_by_type(p.data for p in self.module.parameters()):  # :257 (:38-51, :72-77)
            flat = _flatten_dense_tensors(bucket)
            dist.broadcast(flat, 0)
            for tensor, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                tensor.copy_(synced)

    def enable_allreduce(self) -> None:  # :279-283
        self._disable_allreduce = False

    def disable_allreduce(self) -> None:
        self._disable_allreduce = True

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """:563-643: (re)sets the bucket bookkeeping for the backward to come."""
        result = self.module(*inputs, **kwargs)
        if not self._disable_allreduce:
            if not self.delay_allreduce:
                params = [p for p in self.module.parameters() if p.requires_grad]
                if (not self.active_params or len(params) != len(self.active_params)
                        or any(a is not b for a, b in zip(params, self.active_params, strict=True))):
                    self.needs_refresh = True  # :577-580
                if self.needs_refresh:  # :582-592
                    self.active_i_buckets: list[list[int]] = []
                    self.buckets: list[list[Any]] = []
                    self.tmp_buckets: list[list[int]] = [[], [], []]
                    self.tmp_numels = [0, 0, 0]
                    self.bucket_sizes: list[int] = []
                    self.param_id_to_active_i = {id(p): i for i, p in enumerate(params)}
                    self.param_id_to_bucket: dict[int, tuple[int, int]] = {}
                else:  # :593-634 (no streams)
                    self.buckets = [[None] * size for size in self.bucket_sizes]
                    self.buckets_ready_size = [0] * self.num_buckets
                    self.next_bucket = 0
                    self.ready_buckets_not_reduced: set[int] = set()
                self.active_params = params  # :636
            self.callback_queued = False  # :638
        return result

    def _allreduce_hook(self, param: nn.Parameter) -> None:
        """:362-404 (an attribute error, as in apex, when backward runs without a forward through the wrapper)."""
        if self._disable_allreduce:
            return
        if self.delay_allreduce or self.needs_refresh:
            if not self.delay_allreduce and self.needs_refresh:  # :371-394: the buckets, as gradients arrive
                kind = self.param_type_to_tmp_i[cuda_type(param)]
                self.tmp_buckets[kind].append(self.param_id_to_active_i[id(param)])
                self.tmp_numels[kind] += param.numel()
                if self.tmp_numels[kind] >= self.message_size:
                    self.active_i_buckets.append(self.tmp_buckets[kind])
                    self.tmp_buckets[kind], self.tmp_numels[kind] = [], 0
            if not self.callback_queued:  # :396-398
                torch.autograd.Variable._execution_engine.queue_callback(self._allreduce_params)
                self.callback_queued = True
        else:
            if not self.callback_queued:  # :400-402
                torch.autograd.Variable._execution_engine.queue_callback(self._overlapping_backward_epilogue)
                self.callback_queued = True
            self._comm_ready_buckets(param)

    def _allreduce_params(self) -> None:
        """:328-336."""
        if not self.delay_allreduce and self.needs_refresh:
            self._sync_bucket_structure()
            self.needs_refresh = False
        grads = [p.grad.data for p in self.module.parameters() if p.grad is not None]  # :495-514
        for bucket in _buckets_by_type(grads, (HALF, FLOAT, DOUBLE)):
            self._allreduce_bucket(bucket)

    def _sync_bucket_structure(self) -> None:
        """:287-320: rank 0's buckets, the same on every rank."""
        self.active_i_buckets += [bucket for bucket in self.tmp_buckets if bucket]
        sizes = [len(bucket) for bucket in self.active_i_buckets]
        info = torch.tensor([len(sizes), *sizes, *(i for bucket in self.active_i_buckets for i in bucket)],
                            dtype=torch.int32)
        dist.broadcast(info, 0)
        values = [int(v) for v in info]
        self.num_buckets, self.bucket_sizes = values[0], values[1:values[0] + 1]
        flat = iter(values[self.num_buckets + 1:])
        self.active_i_buckets = [[next(flat) for _ in range(size)] for size in self.bucket_sizes]
        self.buckets = [[None] * size for size in self.bucket_sizes]
        for b, bucket in enumerate(self.active_i_buckets):
            for loc, i in enumerate(bucket):
                self.param_id_to_bucket[id(self.active_params[i])] = (b, loc)

    def _comm_ready_buckets(self, param: nn.Parameter) -> None:
        """:517-560: a full bucket goes at once if every bucket before it has gone, else when they have."""
        b, loc = self.param_id_to_bucket[id(param)]
        if self.buckets[b][loc] is not None:
            raise RuntimeError("The backward pass is attempting to replace an already-filled bucket slot.  This is "
                               "almost certainly an error.")
        self.buckets[b][loc] = param.grad.data
        self.buckets_ready_size[b] += 1
        if self.buckets_ready_size[b] != self.bucket_sizes[b]:
            return
        if b != self.next_bucket:
            self.ready_buckets_not_reduced.add(b)
            return
        self._allreduce_bucket(self.buckets[b])
        self.next_bucket += 1
        for i in sorted(self.ready_buckets_not_reduced):
            if i > self.next_bucket:
                break
            if i < self.next_bucket:
                raise ValueError("i should always be >= next_bucket")
            self._allreduce_bucket(self.buckets[i])
            self.ready_buckets_not_reduced.remove(i)
            self.next_bucket += 1

    def _overlapping_backward_epilogue(self) -> None:
        """:339-352."""
        if self.next_bucket != self.num_buckets:
            raise RuntimeError(f"In epilogue, next_bucket ({self.next_bucket}) != num_buckets ({self.num_buckets}).  ",
                               "This probably indicates some buckets were not allreduced.")
        if any(actual != expected for actual, expected in zip(self.buckets_ready_size, self.bucket_sizes, strict=True)):
            raise RuntimeError("Some param buckets were not allreduced.")

    def _allreduce_bucket(self, bucket: list[torch.Tensor]) -> None:
        """:429-479 (no streams, buffers not retained): flattened, divided by the predivide factor, all-reduced,
        multiplied by factor/world_size, copied back."""
        self.allreduced.append((cuda_type(bucket[0]), len(bucket)))
        flat = _flatten_dense_tensors(bucket)
        reduced = flat.float() if self.allreduce_always_fp32 else flat  # :446-447
        if self.gradient_predivide_factor != 1.0:  # :449-450
            reduced.mul_(1.0 / self.gradient_predivide_factor)
        dist.all_reduce(reduced)  # :455
        if self.gradient_average:  # :457-458
            reduced.mul_(self.gradient_predivide_factor / self.world_size)
        if reduced is not flat:  # :460-461
            flat.copy_(reduced)
        for grad, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):  # :471-472
            grad.copy_(synced)


# ---- the modules --------------------------------------------------------------------------------------------

def modules() -> dict[str, types.ModuleType]:
    """`apex`, `apex.amp` (fresh state) and `apex.parallel`, by the names sys.modules would hold them under."""
    apex, amp, parallel = (types.ModuleType(n) for n in ("apex", "apex.amp", "apex.parallel"))
    fake = FakeAmp()
    amp.initialize, amp.scale_loss, amp._amp_state = fake.initialize, fake.scale_loss, fake._amp_state
    parallel.DistributedDataParallel = DistributedDataParallel
    apex.amp, apex.parallel = amp, parallel
    return {"apex": apex, "apex.amp": amp, "apex.parallel": parallel}


def install(monkeypatch: pytest.MonkeyPatch | None = None) -> types.ModuleType:
    """The fake apex importable as `apex` (for this test, with `monkeypatch`; for the process, without: a
    spawned rank)."""
    made = modules()
    for name, module in made.items():
        if monkeypatch is None:
            sys.modules[name] = module
        else:
            monkeypatch.setitem(sys.modules, name, module)
    return made["apex"]


@pytest.fixture
def fake_apex(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    return install(monkeypatch)
