"""NVIDIA apex's own amp (`amp.initialize` / `amp.scale_loss`): only apex releases up to tag 25.05 have it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from amp.base import Amp
from harness.core.amp_levels import AmpSpec
from harness.core.optional import apex_missing


class ApexAmp(Amp):
    # apex/amp/_process_optimizer.py, post_backward_with_master_weights: `fp32_param.grad =
    # torch.empty_like(fp32_param)` beside the fp16 gradient, which only prepare_backward_with_master_weights
    # (before the next backward) drops: `param.grad = None`.
    keeps_model_grads_at_step = True

    @staticmethod
    def unavailable_reason(spec: AmpSpec, accelerator: str) -> str | None:
        missing = apex_missing("amp")
        if missing:
            return f"amp.impl=apex: {missing}"
        if accelerator != "cuda":
            return "amp.impl=apex needs CUDA GPUs (apex.amp has no CPU path); use amp.impl=native on CPU"
        if spec.dtype == "bfloat16":
            return "amp.impl=apex casts to float16 only: use amp.dtype=float16 or amp.impl=native"
        return None

    def connect(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """apex casts and builds its masters in one call over the model and its optimizer, before any parallel
        wrapper (apex/amp/_initialize.py, check_models: "Parallel wrappers should only be applied to the
        model(s) AFTER the model(s) have been returned from amp.initialize.")."""
        from apex import amp

        self._amp = amp
        spec = self.spec
        options: dict[str, Any] = {"opt_level": spec.level, "verbosity": 0,
                                   "loss_scale": spec.loss_scale}
        if spec.cast_model:  # apex 25.05 refuses them at O1 (amp/frontend.py:72-89); O0 ignores them
            options.update(keep_batchnorm_fp32=spec.keep_batchnorm_fp32, master_weights=spec.master_weights)
        model, self._optimizer = amp.initialize(model, optimizer, **options)
        return model, self._optimizer

    def backward(self, loss: torch.Tensor) -> None:
        with self._amp.scale_loss(loss, self._optimizer) as scaled:
            scaled.backward()

    def state(self) -> dict[str, Any]:
        scalers = self._amp._amp_state.loss_scalers
        return {"final_loss_scale": float(scalers[0].loss_scale()) if scalers else None, "skipped_steps": None}
