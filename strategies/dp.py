"""torch.nn.DataParallel: one process, the model copied to every chosen GPU each step, the batch
scattered, outputs gathered and gradients reduced on the first (base) GPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from amp import AmpSpec
from harness.core.devices import Placement
from harness.core.traffic import Collective, Traffic
from strategies.base import AmpRule, SingleProcessStrategy


class DataParallelStrategy(SingleProcessStrategy):
    drives_all_devices = True
    needs_cuda = True
    # apex O0/O2/O3 replace model.forward by a closure over the original module
    # (apex/amp/_initialize.py, 25.05: `model.forward = patch_forward(model.forward)`); DataParallel's
    # replicate copies __dict__, closure included, so every replica would run GPU 0's weights
    # (apex issues #227, #503, #659, #826). O1 patches torch functions instead and is fine.
    amp_rules = (AmpRule({"impl": "apex", "level": ("O0", "O2", "O3")}, "impl",
                         "native with strategy=dp at {level} (apex's patched forward would make every DataParallel "
                         "replica run GPU 0's weights; apex works with dp at O1 only)"),)

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """Every iteration: the parameters broadcast from the base GPU to the replicas (waited for, before
        forward) and the replicas' gradients reduced onto it (during backward); a replica of the model on
        every GPU."""
        return Traffic((Collective("broadcast", "params", "none"), Collective("reduce", "grads", "backward")),
                       replicas_per_device=True)

    @classmethod
    def skip_reason(cls, placement: Placement, amp: AmpSpec) -> str | None:
        if placement.accelerator != "cuda":
            return "DataParallel needs two or more CUDA GPUs and this machine has none: nothing to parallelise"
        if len(placement.gpus) < 2 and not placement.explicit_gpus:
            return "DataParallel needs two or more GPUs; only one is visible (gpus=[N] runs it as a baseline)"
        return None

    def wrap(self, model: nn.Module) -> nn.Module:
        ids = list(self.ops.indices)
        return nn.DataParallel(model, device_ids=ids, output_device=ids[0])
