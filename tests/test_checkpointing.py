"""Activation checkpointing of a user's model that names its blocks (`model.checkpoint=none|full|selective`,
harness/core/checkpointing.py, applied by harness/rank/checkpointing.py): the same numbers as without it, less
kept between forward and backward, refused in one line for a model that names no blocks, and seen by the planner.
model=gpt's own modes are tests/test_gpt.py's."""

from __future__ import annotations

import copy
import weakref
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import describe, run_cli
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from examples.custom_transformer import SEQ_LEN, VOCAB, Transformer, batches
from harness import cli
from harness.core.amp_levels import AmpConfig, resolve
from harness.core.checkpointing import MODES, checkpointed, split_model_options
from harness.core.config import DataConfig
from harness.core.errors import ConfigError, Incompatible
from harness.core.inputs import Inputs, bound_options, inputs_of, loss, tokens
from harness.prediction.trace import trace_step
from harness.rank.checkpointing import build_model
from harness.rank.gpt import CHECKPOINT_MODES
from strategies.tp import check_tp_model

TRANSFORMER = "examples.custom_transformer.Transformer"
CUSTOM = ("model=custom", f"model._target_={TRANSFORMER}", "data=custom",
          "data._target_=examples.custom_transformer.batches")


def built(mode: Any, layers: int = 2, target: str = TRANSFORMER, **options: Any) -> nn.Module:
    torch.manual_seed(0)
    return build_model({"_target_": target, "layers": layers, "checkpoint": mode, **options}, {})


def test_the_option_is_the_harnesss_for_a_model_that_does_not_take_it_and_the_gpts_own_for_the_gpt():
    assert split_model_options({"_target_": TRANSFORMER, "layers": 2, "checkpoint": True}) == (
        {"_target_": TRANSFORMER, "layers": 2}, "full")
    assert split_model_options({"_target_": TRANSFORMER, "checkpoint": "Selective"})[1] == "selective"
    assert split_model_options({"_target_": TRANSFORMER})[1] == "none"
    gpt = {"_target_": "harness.rank.gpt.GPT", "checkpoint": "full"}
    assert split_model_options(gpt) == (gpt, "none")  # passed to GPT(checkpoint=...), which recomputes itself
    with pytest.raises(ConfigError, match=r"^model.checkpoint=partial is not allowed: none, full or selective"):
        split_model_options({"_target_": TRANSFORMER, "checkpoint": "partial"})
    assert MODES == CHECKPOINT_MODES  # one set of modes for the GPT's own and the harness's


def test_each_named_block_is_wrapped_in_place_under_its_own_name():
    model = built("full", layers=3)
    plain = built("none", layers=3)
    assert [n for n, m in model.named_modules() if checkpointed(m)] == ["blocks.0", "blocks.1", "blocks.2"]
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]  # a TP plan's names
    copied = copy.deepcopy(model)  # a copy recomputes its own blocks, not the original's
    assert copied.blocks[0].forward.__self__ is copied.blocks[0]
    assert not any(checkpointed(m) for m in plain.modules())


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recomputation_trains_the_same_losses_and_gradients_as_none(mode):
    """Parity at O0: the same model from the same seed, three SGD steps on the same batches, bit for bit."""
    def train(model: nn.Module) -> tuple[list[float], list[torch.Tensor]]:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for step in range(3):
            x, y = batches(4, torch.Generator().manual_seed(step))
            optimizer.zero_grad()
            value = loss(model(x), y)
            value.backward()
            optimizer.step()
            losses.append(value.item())
        return losses, [p.grad.clone() for p in model.parameters()]

    (losses, grads), (reference, reference_grads) = train(built(mode)), train(built("none"))
    assert losses == reference and losses[-1] < losses[0]
    assert all(torch.equal(g, r) for g, r in zip(grads, reference_grads, strict=True))


class Chain(nn.Module):
    """Three blocks of Linear, Tanh, Linear (4 x wider inside), and a head: what autograd keeps, counted by hand."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.Tanh(), nn.Linear(4 * width, width))
                                    for _ in range(3))
        self.head = nn.Linear(width, 2)

    def block_names(self) -> list[str]:
        return [f"blocks.{i}" for i in range(3)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class NoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(SEQ_LEN, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.float())


class Declares(Chain):
    """A model of one's own that reads its options bound to its signature: in `inputs` and `tp_sizes`."""

    @classmethod
    def inputs(cls, options: dict[str, Any], data: Any) -> Inputs:
        return tokens(SEQ_LEN, 8 * bound_options(cls, options)["width"])

    @classmethod
    def tp_sizes(cls, options: dict[str, Any], sequence_parallel: bool) -> dict[str, int]:
        return {"model.width": bound_options(cls, options)["width"]}

    def tp_plan(self, sequence_parallel: bool) -> dict[str, Any]:
        return {}


def test_the_models_own_declarations_are_given_its_options_without_the_harnesss_checkpoint():
    """`inputs` and `tp_sizes` bind the options to the factory's signature, which has no `checkpoint`."""
    section = {"_target_": "test_checkpointing.Declares", "width": 4, "checkpoint": "full"}
    assert inputs_of(section, DataConfig(name="synthetic")) == tokens(SEQ_LEN, 32)
    check_tp_model(SimpleNamespace(model=section, model_name="custom"), 2, False, "strategy.tp")
    with pytest.raises(Incompatible, match="model.width"):
        check_tp_model(SimpleNamespace(model={**section, "width": 3}, model_name="custom"), 2, False, "strategy.tp")


@pytest.mark.parametrize(("mode", "floats"), [("none", 16), ("full", 4)])
def test_full_keeps_only_each_blocks_input(mode, floats):
    """Counted by hand, for n samples of width w: each block's input x_i (n w floats) is kept by its first Linear and
    its Tanh's output (4 n w) by the Tanh and the second Linear; the head keeps its input x_3. Without
    checkpointing: x_0..x_3 and three hidden tensors, 4 n w + 12 n w = 16 n w. With full, a block keeps its input
    alone (torch's checkpoint saves it, to recompute from): x_0..x_3, 4 n w. Autograd's saved tensors, each storage
    once, the weights (kept anyway) left out."""
    torch.manual_seed(0)
    model = build_model({"_target_": "test_checkpointing.Chain", "checkpoint": mode}, {})
    n, width = 5, 8
    weights = {p.data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in weights:
            saved[t.data_ptr()] = t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(torch.randn(n, width, requires_grad=True)).sum()
    assert sum(saved.values()) == floats * n * width
    out.backward()


class KeptAfterForward(TorchDispatchMode):
    """Every tensor an operator makes, watched by a weak reference: what is still alive once the loss is taken is
    what the step keeps for backward (its storages' bytes, each once)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[weakref.ref[torch.Tensor]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.made += [weakref.ref(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out

    def bytes(self) -> int:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in (r() for r in self.made) if t is not None}
        return sum(storages.values())


def test_selective_keeps_less_than_none_and_more_than_full():
    """The transformer's four blocks: full keeps each block's input alone, selective also the outputs of the
    attention kernel and of every other matrix product (harness.rank.gpt's policy), none everything."""
    x, y = batches(8, torch.Generator().manual_seed(0))
    kept = {}
    for mode in MODES:
        model = built(mode, layers=4)
        with KeptAfterForward() as probe:
            value = loss(model(x), y)
        kept[mode] = probe.bytes()
        del value
    assert kept["full"] < kept["selective"] < kept["none"], kept
    assert kept["full"] < kept["none"] / 4, kept


def test_a_model_that_names_no_blocks_is_refused_checkpointing_in_one_line(capsys):
    """Before anything starts (the model built on the meta device): exit 2, one line saying what to add."""
    overrides = ["model=custom", "model._target_=test_checkpointing.NoBlocks", "model.checkpoint=full", "data=custom",
                 "data._target_=examples.custom_transformer.batches"]
    with pytest.raises(SystemExit) as info:
        cli.precheck(overrides)
    lines = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == cli.EXIT_BAD_INPUT and len(lines) == 1, lines
    assert lines[0].startswith("error: model.checkpoint=full is not allowed: none for test_checkpointing.NoBlocks's "
                               "model (it has no block_names())"), lines
    assert "add a method block_names(self) -> list[str]" in lines[0]


def test_the_planner_traces_the_checkpointed_model():
    """The trace recomputes the blocks as the run does, so it predicts less memory for activations and counts the
    recomputed forward in its FLOPs: all of it for full, the part the per-operator policy recomputes for selective."""
    sgd = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.01}
    inputs = Inputs("tokens", factory="examples.custom_transformer.batches", tokens=SEQ_LEN)
    o0 = resolve(AmpConfig(level="O0"), "cpu")
    traces = {mode: trace_step({"_target_": TRANSFORMER, "layers": 2, "checkpoint": mode}, inputs, o0, sgd, 8)
              for mode in MODES}
    assert traces["full"].activations < traces["selective"].activations < traces["none"].activations
    assert traces["full"].flops > traces["selective"].flops > traces["none"].flops
    assert traces["full"].model_flops == traces["selective"].model_flops == traces["none"].model_flops


@pytest.mark.slow
def test_a_users_transformer_runs_checkpointed_end_to_end(tmp_path):
    """One process, no prediction (the planner's trace is the test above): the option reaches the rank, not the
    factory."""
    proc, results = run_cli(*CUSTOM, "model.checkpoint=full", "data.sample=tokens", f"data.tokens_per_sample={SEQ_LEN}",
                            "strategy=single", "batch_size=8", "iterations=20", "log_every=10", "plan.predict=false",
                            tmp_path=tmp_path, one_core=True)
    assert proc.returncode == 0 and results["status"] == "ok", describe(proc)
    assert results["config"]["model"]["checkpoint"] == "full" and "tok/s" in proc.stdout


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_the_examples_tensor_parallel_plan_names_its_own_modules(sequence_parallel):
    """examples/custom_transformer.py declares both: blocks (checkpointing, FSDP2) and a plan (strategy=tp), by
    names that stay the same once its blocks are wrapped."""
    from torch.distributed.tensor.parallel import ParallelStyle

    model = built("full", layers=2)
    plan = model.tp_plan(sequence_parallel)
    modules = dict(model.named_modules())
    assert set(plan) <= set(modules) and all(isinstance(style, ParallelStyle) for style in plan.values())
    assert {"blocks.0.q", "blocks.1.down"} <= set(plan) and ("blocks.0.mlp_norm" in plan) is sequence_parallel
    assert isinstance(model, Transformer) and model.block_names() == ["blocks.0", "blocks.1"]


def test_a_search_checkpoints_a_model_of_ones_own_only_where_it_names_its_blocks():
    """conf/model/custom.yaml has `checkpoint: none`, so a search's checkpoint axis reaches a model of one's own:
    both values for one whose class names its blocks, `false` alone for one that names none (else refused)."""
    from harness.search.shortlist import option_values
    from harness.search.space import Axis

    axis = Axis("model.checkpoint", ("false", "true"))
    for target, values in ((TRANSFORMER, ("false", "true")), ("test_checkpointing.NoBlocks", ("false",))):
        composed = SimpleNamespace(config={"model": {"_target_": target, "checkpoint": "none"}})
        assert option_values(composed, axis) == values, target
