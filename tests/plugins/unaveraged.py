"""A deliberately broken data-parallel strategy, for the numerical-parity tests (tests/test_parity.py): the
hand-written all-reduce (strategies/allreduce.py) with a defect a benchmark alone would never notice.

`SummedGradients` all-reduces the gradients but never divides by the world size: every step is world_size
times too large, yet every replica takes the same step, so the replicas agree with each other and only the
comparison with one device catches it."""

from __future__ import annotations

import torch.distributed as dist

from strategies.allreduce import ManualAllReduce


class SummedGradients(ManualAllReduce):
    def _reduce_gradients(self) -> None:
        self._queued = False
        for p in self._params:
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # the defect: no division by the world size

