"""apex's O0-O3 rebuilt on torch.autocast, torch.amp.GradScaler and explicit fp32 master weights."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from amp.base import NO_CONTEXT, Amp, ShardedPrecision
from harness.core.amp_levels import AmpSpec
from harness.core.devices import cpu_half_reason, emulated_half_scope

_BATCHNORM = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)


class CastingModule(nn.Module):
    """Does the per-forward casting inside forward, where DataParallel's replica threads see it:
    O1 enters autocast (thread-local state), O2/O3 cast floating-point inputs to the half type (token ids stay
    integers); outputs come back fp32, unless the model's own loss upcasts them itself (`upcasts_in_loss`: a fused
    cross-entropy, which a float32 copy of the logits would only double)."""

    def __init__(self, module: nn.Module, input_dtype: torch.dtype | None, autocast_dtype: torch.dtype | None,
                 device_type: str) -> None:
        super().__init__()
        self.module = module
        self.input_dtype, self.autocast_dtype, self.device_type = input_dtype, autocast_dtype, device_type
        self.keep_outputs = upcasts_in_loss(module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_dtype is not None and x.is_floating_point():
            x = x.to(self.input_dtype)
        if self.autocast_dtype is not None:
            with torch.autocast(self.device_type, dtype=self.autocast_dtype):
                out = self.module(x)
        else:
            out = self.module(x)
        return out if self.keep_outputs else out.float()


def upcasts_in_loss(model: nn.Module) -> bool:
    """Whether the model's own loss takes its outputs in their dtype and computes in float32 itself (a model says so
    with an `upcasts_in_loss` attribute: harness.rank.gpt.GPT with a fused cross-entropy)."""
    return bool(getattr(model, "upcasts_in_loss", False))


class HalfGradScaler(torch.amp.GradScaler):
    """GradScaler for an optimizer that steps float16 parameters itself (O3, or O2 without master weights,
    with dynamic scaling, as apex allows). torch's scaler refuses to unscale float16 gradients
    (torch/amp/grad_scaler.py: `raise ValueError("Attempting to unscale FP16 gradients.")`) because
    unscaled small gradients may underflow in float16: that loss of precision is what these levels are."""

    def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor,
                        allow_fp16: bool) -> dict[torch.device, torch.Tensor]:
        return super()._unscale_grads_(optimizer, inv_scale, found_inf, True)


class NativeAmp(Amp):
    @staticmethod
    def skip_reason(spec: AmpSpec, accelerator: str) -> str | None:
        if accelerator != "cpu" or spec.allow_emulated:
            return None
        return cpu_half_reason(spec.dtype, spec.cpu_half)

    def __init__(self, spec: AmpSpec, device: torch.device) -> None:
        super().__init__(spec, device)
        self.half = getattr(torch, spec.dtype)
        self.scaler: torch.amp.GradScaler | None = None
        if spec.loss_scale == "dynamic":  # GradScaler's rules: 2^16, halve on overflow, double after 2000 good
            half_steps = spec.cast_model and not spec.master_weights and spec.dtype == "float16"
            scaler_cls = HalfGradScaler if half_steps else torch.amp.GradScaler
            self.scaler = scaler_cls(device.type, init_scale=2.0**16)
        self.static_scale = 1.0 if spec.loss_scale == "dynamic" else float(spec.loss_scale)
        self._model_params: list[nn.Parameter] = []
        self._master_params: list[nn.Parameter] = []
        self._skipped = torch.zeros((), dtype=torch.int64, device=device)

    def kernels(self) -> contextlib.AbstractContextManager[Any]:
        """amp.cpu_half=emulated honoured on a CPU with native half kernels: ATen's reference kernels, as a
        CPU without them runs (harness.core.devices.emulated_half_scope)."""
        if self.device.type != "cpu" or not (self.spec.cast_model or self.spec.autocast):
            return NO_CONTEXT
        return emulated_half_scope(self.spec.dtype, self.spec.cpu_half)

    def cast_module(self, model: nn.Module) -> nn.Module:
        """O2/O3: the model in half (batch-norm fp32 where kept); O2's fp32 master copies made from it."""
        if not self.spec.cast_model:
            return model
        model.to(self.half)
        if self.spec.keep_batchnorm_fp32:
            for module in model.modules():
                if isinstance(module, _BATCHNORM):
                    module.float()
        if self.spec.master_weights:
            self._model_params = [p for p in model.parameters() if p.requires_grad]
            self._master_params = [nn.Parameter(p.detach().float().clone()) for p in self._model_params]
        return model

    def optimizer_params(self, model: nn.Module) -> Iterable[nn.Parameter]:
        return self._master_params or model.parameters()

    def sharded_precision(self, reduce_dtype: torch.dtype | None,
                          model: nn.Module | None = None) -> ShardedPrecision:
        """O3 (and O2 without masters): the model cast as under any strategy, no policy. O2: FSDP2 gathers and
        computes in half and reduces in fp32; its fp32 sharded parameters are the masters, so the model is not
        cast and no copies are made; the loss comes back fp32, as apex O2's. O1 casts per op (autocast), not
        the parameters. A model whose own loss upcasts (`upcasts_in_loss`) keeps its half outputs."""
        spec = self.spec
        if spec.cast_model and not spec.master_weights:
            return ShardedPrecision(cast_model=True, reduce_dtype=reduce_dtype, norms_apart=spec.keep_batchnorm_fp32)
        if spec.cast_model:
            return ShardedPrecision(param_dtype=self.half, reduce_dtype=reduce_dtype or torch.float32,
                                    output_dtype=None if model is not None and upcasts_in_loss(model) else torch.float32,
                                    norms_apart=spec.keep_batchnorm_fp32)
        return ShardedPrecision(reduce_dtype=reduce_dtype)

    def wrap_module(self, model: nn.Module) -> nn.Module:
        if not (self.spec.cast_model or self.spec.autocast):  # O0: nothing to cast, nothing in the way
            return model
        input_dtype = self.half if self.spec.cast_model else None
        autocast_dtype = self.half if self.spec.autocast else None
        return CastingModule(model, input_dtype, autocast_dtype, self.device.type)

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        if self.spec.autocast:  # the loss, outside the wrapped module, as apex O1 patched it too
            return torch.autocast(self.device.type, dtype=self.half)
        return NO_CONTEXT

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        elif self.static_scale != 1.0:
            loss = loss * self.static_scale
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._master_params:
            self._grads_to_master()
        elif self.scaler is None and self.static_scale != 1.0:
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            torch._foreach_div_(grads, self.static_scale)
        if self.scaler is not None:
            self.scaler.step(optimizer)  # unscales, checks inf/NaN, skips the step on overflow
            self._count_skipped(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        if self._master_params:
            with torch.no_grad():
                torch._foreach_copy_(self._model_params, self._master_params)  # fp32 result into the half model

    def _grads_to_master(self) -> None:
        for model_p, master_p in zip(self._model_params, self._master_params, strict=True):
            if model_p.grad is None:
                master_p.grad = None
                continue
            grad = model_p.grad.float()
            if self.scaler is None and self.static_scale != 1.0:
                grad.div_(self.static_scale)
            master_p.grad = grad
            model_p.grad = None

    def _count_skipped(self, optimizer: torch.optim.Optimizer) -> None:
        # GradScaler keeps its overflow flags on the device; summing them there avoids a host sync.
        found = self.scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]  # type: ignore[union-attr]
        for flag in found.values():
            self._skipped += flag.to(self._skipped.device, torch.int64)

    def state(self) -> dict[str, Any]:
        scale: float | None
        if self.scaler is not None:
            scale = float(self.scaler.get_scale())
        else:
            scale = self.static_scale
        return {"final_loss_scale": scale, "skipped_steps": int(self._skipped.item())}
