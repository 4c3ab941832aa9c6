"""Numerical parity, the parent's side: the ranks' parity records merged into results.json's `parity`.

Replicas of one data-parallel run hold the same parameters bit for bit (every rank applies the same
averaged gradient to the same weights), so their digests must be equal; a rank whose digest differs is a
defect of the strategy and is named. The run's loss curve is the mean of the ranks' losses at each
iteration (equal shards: the mean over the global batch, what one device on the whole batch computes)."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Sequence
from typing import Any

from hydra.utils import get_class

from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.rank_record import RankRecord


def fingerprint(cfg: RunConfig) -> str:
    """What two runs must share for their parameters to be comparable: model (and its options), optimizer,
    data, seed, global batch and iterations asked for. Strategy, amp and launcher are what parity compares;
    `grad_accum` too (the batch's mean gradient either way), except for batch-norm, whose pieces count it
    (`batchnorm_groups`); strategy options that make the update inexact are recorded apart (`lossy`)."""
    what = {"model": cfg.model, "optim": cfg.optim, "data": vars(cfg.data), "seed": cfg.seed,
            "batch_size": cfg.batch_size, "iterations": cfg.iterations}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def batchnorm_groups(placement: Placement, layout: dict[str, Any] | None, grad_accum: int = 1) -> int | None:
    """Into how many pieces each global batch is cut for batch-norm statistics: one per forward pass (a
    process of a data-parallel run, a DataParallel replica), times the shards of a sharded batch-norm, times
    `grad_accum` (each micro-batch is a forward of its own, normalised alone); 1 when synchronized across
    ranks and without accumulation; None for a model without batch-norm."""
    if not layout or not layout.get("layers"):
        return None
    if layout.get("sync"):
        return grad_accum
    forwards = placement.world_size if placement.one_process_per_device else max(1, len(placement.devices))
    return forwards * int(layout.get("shards") or 1) * grad_accum


def batchnorm_split(cfg: RunConfig, placement: Placement, layout: dict[str, Any] | None,
                    groups: int | None) -> str | None:
    """How the pieces are cut from the global batch: `consecutive` slices (synthetic data, one process reading
    the whole batch, a sharded batch-norm: what `strategy=single strategy.batchnorm_shards` cuts), or
    `interleaved`: data=loader's DistributedSampler gives rank r of N the positions r, r+N, r+2N, ..., and
    synchronized batch-norm with grad_accum normalises the ranks' k-th micro-batches together; pieces of the
    same number are then other images than a reference's consecutive slices. None with one piece or no
    batch-norm."""
    if groups is None or groups == 1:
        return None
    ranks = placement.one_process_per_device and placement.world_size > 1
    if ranks and (cfg.data.name == "loader" or (layout or {}).get("sync")):
        return "interleaved"
    return "consecutive"


def lossy(cfg: RunConfig) -> str | None:
    """The strategy's own word on whether its options make the update inexact (Strategy.lossy)."""
    return get_class(cfg.strategy["_target_"]).lossy(cfg.strategy)


def run_parity(cfg: RunConfig, placement: Placement, records: Sequence[RankRecord]) -> dict[str, Any] | None:
    """results.json's `parity` (None when parity is off or no rank got as far as recording it)."""
    parities = {r.rank: r.parity for r in records if r.parity}
    if not cfg.parity.enabled or not parities:
        return None
    digests = {str(rank): p["digest"] for rank, p in parities.items()}
    first = next((d for d in digests.values() if d is not None), None)
    differing = [int(rank) for rank, d in digests.items() if d is not None and d != first]
    compared = sum(d is not None for d in digests.values())
    curves = [p["losses"] for p in parities.values() if p["losses"]]
    length = min((len(c) for c in curves), default=0)
    layout = parities.get(0, next(iter(parities.values()))).get("batchnorm")
    return {
        "reference": cfg.parity.reference,
        "fingerprint": fingerprint(cfg),
        "digests": digests,
        "replicas_agree": None if compared < 2 else not differing,
        "differing_ranks": differing,
        "losses": [statistics.fmean(c[i] for c in curves) for i in range(length)],
        "batchnorm_layers": (layout or {}).get("layers", 0),
        "batchnorm_groups": (groups := batchnorm_groups(placement, layout, cfg.grad_accum)),
        "batchnorm_split": batchnorm_split(cfg, placement, layout, groups),
        "lossy": lossy(cfg),
    }
