"""Numerical parity, a rank's side: after the timed loop, what this rank trained, in a form the parent can
compare between replicas (a digest) and the report against a reference run (the parameters themselves,
saved once by rank 0, and the loss of every iteration).

Nothing here runs inside the timed loop: the loop only keeps each iteration's loss tensor (trainer.py)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.core.results import PARAMETERS_NAME

__all__ = ["PARAMETERS_NAME", "batchnorm_layout", "digest", "load_parameters", "rank_parity", "save_parameters"]


def digest(parameters: Mapping[str, torch.Tensor]) -> str | None:
    """sha256 over names, shapes, dtypes and bytes, in name order: equal exactly when the tensors are
    bit-identical (replicas of one data-parallel run must be). None for an empty mapping (a rank that holds
    no gathered copy)."""
    if not parameters:
        return None
    h = hashlib.sha256()
    for name in sorted(parameters):
        tensor = parameters[name].detach().cpu().contiguous()
        h.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def batchnorm_layout(model: nn.Module) -> dict[str, Any]:
    """How this rank's model normalises: how many batch-norm layers, whether they are synchronized across
    ranks (SyncBatchNorm: the whole global batch), and into how many shards each forward's batch is cut
    (`shards` of strategies.single's sharded batch-norm; 1 otherwise)."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return {"layers": len(norms), "sync": bool(norms) and all(isinstance(m, nn.SyncBatchNorm) for m in norms),
            "shards": max((int(getattr(m, "shards", 1)) for m in norms), default=1)}


def save_parameters(parameters: Mapping[str, torch.Tensor], path: Path) -> None:
    """torch.save to a temp file, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(dict(parameters), temp)
    os.replace(temp, path)


def load_parameters(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def rank_parity(parameters: Mapping[str, torch.Tensor], losses: Sequence[torch.Tensor], model: nn.Module,
                rank: int, path: Path | None) -> dict[str, Any]:
    """This rank's parity record: digest, per-iteration loss (one device read, after the loop), batch-norm
    layout; rank 0 also writes the parameters to `path`."""
    if rank == 0 and path is not None and parameters:
        save_parameters(parameters, path)
    values = torch.stack([loss.float() for loss in losses]).cpu().tolist() if losses else []
    return {"digest": digest(parameters), "losses": values, "batchnorm": batchnorm_layout(model)}
