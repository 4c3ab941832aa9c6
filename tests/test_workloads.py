"""Workloads other than the built-in CNNs: the user's own model and batches (examples/custom_workload.py), the
vision transformer at its own size, and every bad input about them refused in the parent (harness/launch/
model_check.py): one line naming the key, exit 2, nothing written."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from conftest import describe, rank_spec, run_cli

from examples.custom_workload import CLASSES, FEATURES, batches, build
from harness import cli
from harness.compose import compose_one, hydra_context
from harness.core.config import DataConfig
from harness.core.errors import ConfigError
from harness.core.inputs import images, inputs_of
from harness.launch.decide import run_plan
from harness.launch.model_check import check_model
from harness.launch.placement import probe_hardware

CUSTOM = ("model=custom", "model._target_=examples.custom_workload.build", "data=custom",
          "data._target_=examples.custom_workload.batches")


def test_the_examples_batches_are_drawn_from_the_generator_and_learnable():
    x, y = batches(64, torch.Generator().manual_seed(0))
    assert x.shape == (64, FEATURES) and y.shape == (64,) and int(y.max()) < CLASSES
    again, _ = batches(64, torch.Generator().manual_seed(0))
    assert torch.equal(x, again)
    assert build(width=16, depth=3).block_names() == ["blocks.0", "blocks.1", "blocks.2"]


def test_custom_data_is_what_the_users_factory_draws():
    data = DataConfig(name="custom", target="examples.custom_workload.batches")
    inputs = inputs_of({"_target_": "examples.custom_workload.build"}, data)
    assert inputs.kind == "samples" and inputs.tokens_per_sample is None and not inputs.provided
    assert inputs.input_bytes == FEATURES * 4 + 8  # one sample: fp32 features and an int64 label
    (x, y), = inputs.batches(1, 5, torch.Generator().manual_seed(0))
    assert torch.equal(x, batches(5, torch.Generator().manual_seed(0))[0])
    check_model({"_target_": "examples.custom_workload.build"}, inputs, 32)  # builds and fits: no error


class KeepsAMask(torch.nn.Module):
    """A tensor of its own, not a buffer: it stays on the meta device the check builds the model on."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.mask = torch.nn.Linear(FEATURES, CLASSES), torch.ones(FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x * self.mask)


def test_a_small_model_steps_on_the_cpu_a_large_one_on_the_meta_device(monkeypatch):
    from harness.launch import model_check

    model_check._check.cache_clear()  # a check another test made in this process is not made again
    stepped = []
    step = model_check._step
    monkeypatch.setattr(model_check, "_step", lambda m, x, y, fed: (stepped.append(x.device.type), step(m, x, y, fed)))
    data = DataConfig(name="custom", target="examples.custom_workload.batches")
    inputs = inputs_of({"_target_": "examples.custom_workload.build"}, data)
    built = check_model({"_target_": "examples.custom_workload.build"}, inputs, 32)
    assert stepped == ["cpu"] and {p.device.type for p in built.parameters()} == {"meta"}  # nothing kept
    check_model({"_target_": "test_workloads.KeepsAMask"}, inputs, 32)  # fails on the CPU, steps on meta: fine
    assert stepped[1:] == ["cpu", "meta"]
    monkeypatch.setattr(model_check, "SMALL_MODEL_BYTES", 0)
    with pytest.raises(ConfigError, match="Expected 224 but got 32"):  # refused on the meta device alone too
        check_model({"_target_": "torchvision.models.vit_b_16"}, images(32, 10), 32)
    assert stepped[3:] == ["meta"]


@pytest.mark.parametrize(("overrides", "key", "words"), [
    (("model=custom", "model._target_=nope.build"), "model._target_", "importable"),
    (("model=custom", "model._target_=examples.custom_workload.FEATURES"), "model._target_", "importable"),
    (("model=custom", "model._target_=builtins.dict"), "model._target_", "torch.nn.Module (it returned dict)"),
    (("model=resnet18", "model.name=vit_b_17"), "model.name", "vit_b_16"),
    (("model=resnet18", "model.name=vit_b_16"), "data.image_size", "Expected 224 but got 32"),
    ((*CUSTOM[:3], "data._target_=nope.batches"), "data._target_", "importable batch factory"),
    ((*CUSTOM[:3], "data._target_=torch.randn"), "data._target_", "a batch factory"),
    ((*CUSTOM[:3], "data._target_=builtins.slice"), "data._target_", "returned slice: a pair of tensors"),
    (("model=tiny_cnn", "+model.num_classes=8", "data=custom", "data._target_=examples.custom_workload.batches"),
     "data._target_", "fails"),  # a CNN fed feature vectors
    (("model=gpt", "model.width=18"), "model.width", "multiple of 2 x model.heads"),
])
def test_a_model_or_batch_that_cannot_work_is_refused_before_anything_starts(overrides, key, words, capsys):
    """run.py's checks before Hydra starts (in this process: nothing is written before them)."""
    with pytest.raises(SystemExit) as info:
        cli.precheck(list(overrides))
    lines = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == cli.EXIT_BAD_INPUT and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {key}=") and words in lines[0], lines


@pytest.mark.slow
def test_the_users_model_and_batches_run_end_to_end(tmp_path):
    """One process (FSDP2 per block is tests/test_gpt.py's, on a model that names its blocks the same way)."""
    proc, results = run_cli(*CUSTOM, "strategy=single", "batch_size=16", "iterations=40", "log_every=10",
                            tmp_path=tmp_path, one_core=True)
    assert proc.returncode == 0 and results["status"] == "ok", describe(proc)
    assert results["sample"] == "samples" and results["image_size"] is None and "samples/s" in proc.stdout
    losses = [w["loss"] for w in results["windows"]]
    assert losses[-1] < losses[0]  # the example's classes can be learnt
    assert json.dumps(results["config"]["data"]).count("examples.custom_workload.batches") == 1


def test_a_vision_transformer_is_fed_images_of_its_own_size(tmp_path):
    """model=vit's image_size, not data.image_size, makes its batches and is what results.json records."""
    spec = rank_spec(tmp_path, model={"_target_": "harness.rank.models.vit", "image_size": 16, "patch_size": 4},
                     data={"name": "synthetic", "image_size": 99, "num_classes": 10})
    assert spec.plan.inputs == images(16, 10) and spec.plan.inputs.image_size == 16


def test_a_vision_transformer_is_traced_at_o1_too():
    """torchvision's ViT initialises with trunc_normal_, which fake tensors (the O1 trace's) cannot run: it is
    traced built on the meta device instead, so its O1 rows get FLOPs (MFU) and a predicted peak. The FLOPs are
    the same computation at either level, but for attention's kernel, counted apart under autocast (27.5 against
    29.3 MFLOP here)."""
    from harness.core.amp_levels import AmpConfig, resolve
    from harness.prediction.trace import trace_step

    model = {"_target_": "harness.rank.models.vit", "image_size": 16, "patch_size": 4}
    sgd = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.01}
    o1, o0 = (trace_step(model, images(16, 10), resolve(AmpConfig(level=level), "cpu"), sgd, 4)
              for level in ("O1", "O0"))
    assert o1.tracer == "fake" and o1.peak > 0 and o1.flops == pytest.approx(o0.flops, rel=0.1)


@pytest.mark.parametrize(("strategy", "target", "noted"), [("fsdp", "torch.nn.Linear", True),
                                                          ("fsdp", "examples.custom_workload.build", False),
                                                          ("ddp", "torch.nn.Linear", False)])
def test_fsdp_says_so_when_the_model_has_no_blocks_to_shard(strategy, target, noted):
    """Never sharded at the root in silence: the run's notes (results.json `notes`, the terminal) say it."""
    options = ["+model.in_features=32", "+model.out_features=8"] if target == "torch.nn.Linear" else []
    with hydra_context():
        composed = compose_one([f"strategy={strategy}", "model=custom", f"model._target_={target}", *options,
                                *CUSTOM[2:]])
    plan = run_plan(composed.run, probe_hardware(), resolved=composed.config)
    notes = [n for n in plan.placement.notes if "names no blocks" in n]
    assert bool(notes) is noted, plan.placement.notes


TRANSFORMER = ("model=custom", "model._target_=examples.custom_transformer.Transformer", "data=custom",
               "data._target_=examples.custom_transformer.batches")


def test_the_example_transformer_declares_what_tensor_parallelism_reads(monkeypatch, capsys):
    """examples/custom_transformer.py (docs/workloads.md, "Tensor parallelism and checkpointing together"): its
    heads by the key that sets them, so a degree that does not divide them is refused before anything starts, in
    one line; its width and blocks for the planner, whatever else the options hold (the harness's `checkpoint`)."""
    from conftest import refused_before_start

    from examples.custom_transformer import Transformer

    assert Transformer.tp_sizes({}, False) == {"model.heads": 4}
    assert Transformer.tp_sizes({"heads": 8, "width": 128}, True) == {"model.heads": 8}
    assert Transformer.tp_activations({"layers": 3, "width": 32, "checkpoint": "full", "name": "x"}) == (32, 3)
    assert refused_before_start([*TRANSFORMER, "+model.heads=2", "strategy=fsdp", "strategy.tp=4", "nprocs=4"],
                                monkeypatch, capsys) == [
        "error: model.heads=2 is not allowed: a multiple of the 4 tensor-parallel ranks (strategy.tp=4): each rank "
        "computes 1/4 of them"]


class LegacyStepCounter(torch.optim.SGD):
    """As torch.optim.Adam before torch 2.14: its step counter made on the default device
    (`torch.tensor(0.0, dtype=...)`, no device) and read back with `.item()` (torch 2.11's adam.py)."""

    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state.setdefault("step", torch.tensor(0.0, dtype=torch.float32))
                state["step"] += 1
                assert state["step"].item() >= 1
        return super().step(closure)


def test_an_optimizer_that_keeps_its_step_count_on_the_default_device_is_traced_on_meta():
    """The O0 trace builds on the meta device; an optimizer making a scalar there and reading it failed with
    "Tensor.item() cannot be called on meta tensors" (every Adam prediction on an H200 with torch 2.11)."""
    from harness.core.amp_levels import AmpConfig, resolve
    from harness.prediction.trace import trace_step

    model = {"_target_": "harness.rank.models.TinyCNN", "num_classes": 10}
    optim = {"_target_": f"{__name__}.LegacyStepCounter", "_partial_": True, "lr": 0.01}
    got = trace_step(model, images(16, 10), resolve(AmpConfig(level="O0"), "cpu"), optim, 4)
    assert got.tracer == "meta" and got.flops > 0
