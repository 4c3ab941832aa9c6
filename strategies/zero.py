"""ZeRO stage 1: DDP, with the optimizer state sharded across ranks by torch's ZeroRedundancyOptimizer.

Every rank keeps every parameter and gradient (DDP all-reduces them as usual) but steps, and holds the
optimizer state of, only its own share of the parameters; after its step it broadcasts the updated share
to the others. Against DDP it saves optimizer-state memory (momentum, Adam's two moments) and costs those
broadcasts. The optimizer the config names (`optim=...`) is the one ZeRO shards. Under O2 the parameters
it steps are the amp plugin's fp32 master weights, as DDP's optimizer does; apex's amp keeps its masters
where ZeRO never steps them, and is refused at the levels that have them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from amp import OptimizerSpec
from harness.core.traffic import Collective, Traffic
from strategies.base import AmpRule, Backend
from strategies.ddp import CommHook, TorchDDP


class ZeroDDP(TorchDDP):
    searchable = True
    shards = (False, False, True)
    # apex swaps its fp32 masters into the optimizer's param_groups (apex/amp/_process_optimizer.py,
    # lazy_init_with_master_weights: `param_group['params'][i] = master_param`), but ZeroRedundancyOptimizer
    # steps its inner optimizer, built from the parameters it was given
    # (torch/distributed/optim/zero_redundancy_optimizer.py: `self.optim.step(**kwargs)`); apex's new_step then
    # copies the never-stepped masters over the model (`self._master_params_to_model_params()`)
    amp_rules = (AmpRule({"impl": "apex", "master_weights": True}, "impl",
                         "native with strategy=zero at {level} with master weights, or amp.master_weights=false: "
                         "ZeroRedundancyOptimizer would step the half weights, not apex's fp32 masters, which apex "
                         "then copies back over the model every step"),)

    def __init__(self, find_unused_parameters: bool = False, bucket_cap_mb: float = 25,
                 gradient_as_bucket_view: bool = False, comm_hook: CommHook = "none", powersgd_rank: int = 1,
                 powersgd_start_iter: int = 2, parameters_as_bucket_view: bool = False,
                 backend: Backend = "auto") -> None:
        super().__init__(find_unused_parameters, bucket_cap_mb, gradient_as_bucket_view, comm_hook, powersgd_rank,
                         powersgd_start_iter, backend)
        self.parameters_as_bucket_view = parameters_as_bucket_view

    @classmethod
    def traffic(cls, options: Mapping[str, Any]) -> Traffic:
        """DDP's, then after the step every rank broadcasts its updated share, waited for: one broadcast per
        parameter, each paying the latency (torch's ZeroRedundancyOptimizer._broadcast_params_from_rank: "sent
        parameter-by-parameter" unless `parameters_as_bucket_view`, then one bucket a rank, here one call)."""
        ddp = super().traffic(options)
        calls = "whole" if options.get("parameters_as_bucket_view") else "per_param"
        return Traffic(ddp.collectives + (Collective("broadcast", "stored_params", "none", calls=calls),),
                       ddp.buffers)

    def build_optimizer(self, params: Iterable[nn.Parameter], optimizer: OptimizerSpec) -> torch.optim.Optimizer:
        """The configured optimizer's class and keywords, inside ZeRO: each rank builds it over its share."""
        return ZeroRedundancyOptimizer(list(params), optimizer_class=optimizer.cls,
                                       parameters_as_bucket_view=self.parameters_as_bucket_view, **optimizer.kwargs)
