"""NVIDIA apex's DistributedDataParallel (apex <= 25.05), launched exactly like torch DDP."""

from __future__ import annotations

from torch import nn

from precision.apex_amp import apex_missing
from strategies.base import ProcessGroupStrategy


class ApexDDP(ProcessGroupStrategy):
    needs_cuda = True

    def __init__(self, name: str, delay_allreduce: bool = False, message_size: int = 10_000_000,
                 convert_syncbn: bool = False) -> None:
        super().__init__(name)
        self.delay_allreduce, self.message_size, self.convert_syncbn = delay_allreduce, message_size, convert_syncbn

    @classmethod
    def unavailable_reason(cls) -> str | None:
        missing = apex_missing("parallel")
        return f"strategy=apex_ddp: {missing}" if missing else None

    def convert_module(self, model: nn.Module) -> nn.Module:
        if not self.convert_syncbn:
            return model
        from apex.parallel import convert_syncbn_model

        return convert_syncbn_model(model)

    def wrap(self, model: nn.Module) -> nn.Module:
        from apex.parallel import DistributedDataParallel

        return DistributedDataParallel(model, message_size=self.message_size, delay_allreduce=self.delay_allreduce)
