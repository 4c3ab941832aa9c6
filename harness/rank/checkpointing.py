"""The run's model as a rank builds it: the factory called with its own options, then the activation
checkpointing the harness applies to a model of the user's own (harness.core.checkpointing), whose `selective`
per-operator policy harness.rank.gpt follows too: one policy for the GPT and the user's blocks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra.utils import instantiate
from torch import nn

from harness.core.checkpointing import checkpoint_blocks, split_model_options


def build_model(section: Mapping[str, Any], provided: Mapping[str, Any]) -> nn.Module:
    """`section`'s `_target_` called with its options and `provided` (a classifier's num_classes), its named blocks
    recomputed in backward where `model.checkpoint` asks it of a model that does not checkpoint itself."""
    options, mode = split_model_options(section)
    model = instantiate(options, **dict(provided))
    return checkpoint_blocks(model, mode, str(options.get("_target_")))
