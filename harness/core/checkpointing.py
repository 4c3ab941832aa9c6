"""Activation checkpointing the harness applies to a model of the user's own: `model.checkpoint=none|full|selective`.

`model=gpt` checkpoints its own blocks (its constructor takes `checkpoint`). A user's factory does not: there the
option is the harness's, taken out of the model's section before the factory is called (`split_model_options`)
and applied to the built model (`checkpoint_blocks`), on every block its `block_names()` names, the same
declaration FSDP2 shards by. `full` recomputes a block's whole forward in backward (`torch.utils.checkpoint`
without re-entrance); `selective` recomputes it under the per-operator policy here (`selective_policy`), the one
`model=gpt` (harness.rank.gpt) follows too.

Here, in the bottom layer, because the launching process's model check and the planner's trace
(harness.prediction.trace) build the model as a rank does and must take the same option out of the same
section; the module imports nothing of the project above harness.core. torch is imported where a model is
wrapped: the config check (harness.core.config) reads the option without it.
"""

from __future__ import annotations

import functools
import inspect
import pydoc
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

from harness.core.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.checkpoint import CheckpointPolicy

CheckpointMode = Literal["none", "full", "selective"]
MODES: tuple[str, ...] = get_args(CheckpointMode)
OPTION = "checkpoint"  # the key in the model's section: `model.checkpoint=full`
ALLOWED = "none, full or selective (true means full, false none)"
Policy = Callable[..., "CheckpointPolicy"]
_CONTEXT = "_harness_checkpoint_context"  # a wrapped block's context_fn (None: full), kept on the block itself


def mode_of(key: str, value: object) -> CheckpointMode:
    """The option as one of MODES: true is full, false (and null) none; the names in any case."""
    if value is None or isinstance(value, bool):
        return "full" if value else "none"
    if isinstance(value, str):
        name = {"true": "full", "false": "none"}.get(value.strip().lower(), value.strip().lower())
        if name in MODES:
            return name  # type: ignore[return-value]
    raise ConfigError(key, value, ALLOWED)


def taken_by_harness(section: Mapping[str, Any]) -> bool:
    """Whether the section's `checkpoint` is the harness's: the model's `_target_` imports and its signature
    names no such argument (model=gpt's does: its own modes). A target that does not import is left to the
    model check, which names it."""
    if OPTION not in section:
        return False
    try:
        factory = pydoc.locate(str(section.get("_target_", "")))
    except Exception:  # noqa: BLE001 (a module that fails to import: the plugin check says how)
        return False
    if not callable(factory):
        return False
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return True
    return OPTION not in parameters or parameters[OPTION].kind in (inspect.Parameter.VAR_POSITIONAL,
                                                                   inspect.Parameter.VAR_KEYWORD)


def split_model_options(section: Mapping[str, Any], prefix: str = "model") -> tuple[dict[str, Any], CheckpointMode]:
    """The section as the factory takes it, and the checkpointing the harness applies after building ("none" for a
    model that checkpoints itself, or was not asked to). Raises ConfigError for a mode that is none of MODES."""
    options = dict(section)
    if not taken_by_harness(options):
        return options, "none"
    return options, mode_of(f"{prefix}.{OPTION}", options.pop(OPTION))


def named_blocks(model: nn.Module, mode: CheckpointMode, target: str) -> list[str]:
    """The blocks `model.block_names()` names, each a submodule; ConfigError in one line for a model that names
    none (or names what it does not have): `model.checkpoint` needs them, and says what to add."""
    declared = getattr(model, "block_names", None)
    names = list(declared()) if callable(declared) else []
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules or n == ""]
    if not names or missing:
        why = f"its block_names() names {missing[0]!r}, which is no submodule of it" if missing else \
            "it has no block_names()"
        raise ConfigError(f"model.{OPTION}", mode, f"none for {target}'s model ({why}): full and selective recompute "
                          "the blocks a model names, so add a method block_names(self) -> list[str] returning their "
                          "submodule names, e.g. ['blocks.0', 'blocks.1'] (docs/workloads.md)")
    return names


def checkpoint_blocks(model: nn.Module, mode: CheckpointMode, target: str,
                      selective: Callable[[], Policy] | None = None) -> nn.Module:
    """`model` with each named block's forward recomputed in backward (in place; "none": as it is). The block
    stays the same module under the same name (a strategy's hooks, FSDP2's units and a tensor-parallel plan's
    names find it as before): its forward is replaced, as harness.rank.gpt runs its blocks, by one that runs the
    class's forward under `torch.utils.checkpoint` while gradients are recorded. `selective()`: a fresh policy
    for each call (it may count operators); `selective_policy` unless another is given."""
    if mode == "none":
        return model
    modules = dict(model.named_modules())
    for name in named_blocks(model, mode, target):
        block = modules[name]
        context = None if mode == "full" else _contexts(selective or selective_policy)
        object.__setattr__(block, _CONTEXT, context)  # a plain attribute: neither a parameter nor a submodule
        block.forward = types.MethodType(_recomputed_forward, block)  # type: ignore[method-assign]
    return model


def checkpointed(module: nn.Module) -> bool:
    """Whether `module` is a block `checkpoint_blocks` wrapped."""
    return hasattr(module, _CONTEXT)


# "selective": torchtitan's per-op selective activation checkpointing ("op" mode). A block's forward runs under a
# policy that keeps the outputs of its matrix products, all but every second one, and of the fused attention
# kernels, and recomputes the rest (norms, activations, rotations, reshapes) in backward. A Linear with a bias
# dispatches to addmm rather than mm, so addmm counts as a matrix product too (torchtitan's Llama has no biases).
MATMUL_OPS = ("mm", "addmm", "linear")
ATTENTION_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")


@functools.cache
def operators() -> tuple[frozenset[Any], frozenset[Any]]:
    """The matrix products and the attention kernels `selective_policy` looks for, as aten overloads (those this
    torch has): looked up once, when a policy first runs, so that importing this module needs no torch."""
    import torch

    def found(names: tuple[str, ...]) -> frozenset[Any]:
        return frozenset(getattr(torch.ops.aten, name).default for name in names if hasattr(torch.ops.aten, name))

    return found(MATMUL_OPS), found(ATTENTION_OPS)


def selective_policy() -> Policy:
    """A fresh policy for one checkpointed call: matrix products counted apart in the forward and in the
    recomputation (which must make the same choices), every second one recomputed."""
    from torch.utils.checkpoint import CheckpointPolicy

    matmuls, attention = operators()
    counts = {False: 0, True: 0}  # ctx.is_recompute -> matrix products seen

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if op in matmuls:
            counts[ctx.is_recompute] += 1
            return CheckpointPolicy.PREFER_RECOMPUTE if counts[ctx.is_recompute] % 2 == 0 \
                else CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.MUST_SAVE if op in attention else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _contexts(selective: Callable[[], Policy]) -> Callable[[], Any]:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return lambda: create_selective_checkpoint_contexts(selective())


def _recomputed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A wrapped block's forward: its class's own, recomputed in backward while gradients are recorded (a
    method of the block, so that a deep copy of the model wraps the copy's blocks)."""
    import torch
    from torch.utils.checkpoint import checkpoint as recompute

    forward = types.MethodType(type(self).forward, self)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    context = getattr(self, _CONTEXT)
    extra = {} if context is None else {"context_fn": context}
    return recompute(forward, *args, use_reentrant=False, **extra, **kwargs)
