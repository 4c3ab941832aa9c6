"""torch.nn.DataParallel: one process, the model copied to every chosen GPU each step, the batch
scattered, outputs gathered and gradients reduced on the first (base) GPU."""

from __future__ import annotations

from torch import nn

from harness.config import PrecisionSpec
from harness.devices import Placement
from strategies.base import Strategy


class DataParallelStrategy(Strategy):
    drives_all_devices = True
    needs_cuda = True

    @classmethod
    def skip_reason(cls, placement: Placement, precision: PrecisionSpec) -> str | None:
        if placement.accelerator != "cuda":
            return "DataParallel needs two or more CUDA GPUs and this machine has none: nothing to parallelise"
        if len(placement.gpus) < 2 and not placement.explicit_gpus:
            return "DataParallel needs two or more GPUs; only one is visible (gpus=[N] runs it as a baseline)"
        return None

    def wrap(self, model: nn.Module) -> nn.Module:
        assert self.ops is not None
        ids = list(self.ops.indices)
        return nn.DataParallel(model, device_ids=ids, output_device=ids[0])
