"""NVIDIA apex's DistributedDataParallel (apex <= 25.05), launched exactly like torch DDP."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from amp import AmpSpec
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.errors import Incompatible
from harness.core.optional import apex_missing
from harness.core.traffic import Buffer, Collective, Traffic
from strategies.base import AmpRule, ProcessGroupStrategy


class ApexDDP(ProcessGroupStrategy):
    # apex DDP buckets gradients by type and knows only "torch.cuda.HalfTensor", "FloatTensor" and
    # "DoubleTensor" (apex/parallel/distributed.py, 25.05): bfloat16 weights give a KeyError at the
    # first backward, or with delay_allreduce gradients that are silently never reduced.
    amp_rules = (AmpRule({"cast_model": True, "dtype": "bfloat16"}, "dtype",
                         "float16 with strategy=apex_ddp at {level} (apex DDP reduces only half, float and double "
                         "gradients; bfloat16 weights would fail or go unreduced)"),)
    needs_cuda = True

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """Flattened buckets of `message_size` elements all-reduced during backward (after it, with
        delay_allreduce); the flat buffers are a second copy of the gradients."""
        overlap = "none" if cls.options_of(options).get("delay_allreduce") else "backward"
        return Traffic((Collective("all_reduce", "grads", overlap),), (Buffer("grads"),))

    def __init__(self, delay_allreduce: bool = False, message_size: int = 10_000_000,
                 convert_syncbn: bool = False) -> None:
        super().__init__()
        self.delay_allreduce, self.message_size, self.convert_syncbn = delay_allreduce, message_size, convert_syncbn

    @classmethod
    def check_run(cls, cfg: RunConfig, placement: Placement, amp: AmpSpec) -> None:
        super().check_run(cfg, placement, amp)
        grad_accum = cfg.grad_accum
        if grad_accum > 1:  # torch DDP's no_sync has no counterpart the harness could test against apex here
            raise Incompatible("grad_accum", grad_accum, "1 with strategy=apex_ddp (apex's DDP has no no_sync; "
                               "every micro-batch would be all-reduced, which is not gradient accumulation as "
                               "the DDP-family strategies do it)")

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
