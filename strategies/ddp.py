"""torch.nn.parallel.DistributedDataParallel, one process per device."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from strategies.base import Backend, ProcessGroupStrategy


class TorchDDP(ProcessGroupStrategy):
    def __init__(self, find_unused_parameters: bool = False, bucket_cap_mb: float = 25,
                 gradient_as_bucket_view: bool = False, backend: Backend = "auto") -> None:
        super().__init__()
        self.backend = backend
        self.options = dict(find_unused_parameters=find_unused_parameters, bucket_cap_mb=bucket_cap_mb,
                            gradient_as_bucket_view=gradient_as_bucket_view)

    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, **self.options)
