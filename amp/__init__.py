"""Amp plugins: how forward, backward and the optimizer step are cast and scaled at apex's levels O0-O3.

The levels (what O2 means) are in `harness.core.amp_levels`; how they are done, in `amp.native` (torch.autocast,
GradScaler, fp32 master weights) and `amp.apex` (NVIDIA apex <= 25.05). conf/amp/ names the plugin class
with `_target_`, chosen by `amp.impl`.
"""

from __future__ import annotations

import torch
from hydra.utils import get_class

from amp.base import Amp, OptimizerSpec, ShardedPrecision
from harness.core.amp_levels import AmpConfig, AmpSpec, resolve

__all__ = ["Amp", "AmpConfig", "AmpSpec", "OptimizerSpec", "ShardedPrecision", "build_amp", "plugin_class", "resolve"]


def plugin_class(target: str) -> type[Amp]:
    cls = get_class(target)
    if not (isinstance(cls, type) and issubclass(cls, Amp)):
        raise TypeError(f"{target} is not an amp plugin (a subclass of amp.base.Amp)")
    return cls


def build_amp(target: str, spec: AmpSpec, device: torch.device) -> Amp:
    return plugin_class(target)(spec, device)
