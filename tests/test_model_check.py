"""harness/launch/model_check.py: what the meta device cannot check, checked on the two samples' values (an id out
of an embedding's range, a target out of the classes, a dtype no layer takes), whatever the model's size; and
the planner's failure in the user's own model code refused before launch (harness/launch/runner.py predict_run).
This module is also the user's package of its end-to-end test: it imports nothing of the tests at its top."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import nn

from harness.core.config import DataConfig
from harness.core.errors import ConfigError
from harness.core.inputs import inputs_of
from harness.launch import model_check
from harness.launch.model_check import check_model, raised_in_users_code

HERE = "tests.test_model_check"
FEATURES, CLASSES = 32, 8


class TextClassifier(nn.Module):
    """A user's text classifier: mean of its tokens' embeddings, then a linear head."""

    def __init__(self, vocab: int = 1000, width: int = 8) -> None:
        super().__init__()
        self.embedding, self.head = nn.Embedding(vocab, width), nn.Linear(width, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids[:, 1:]).mean(1))  # a view of the batch: its values are still known


def ids_below_1000(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids up to 999 (each sample ends with it): what a vocabulary of 1,000 takes."""
    ids = torch.randint(0, 1000, (n, 17), generator=generator)
    ids[:, -1] = 999
    return ids, torch.randint(0, CLASSES, (n,), generator=generator)


def float64_features(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """numpy's default dtype: no amp level casts it for a float32 Linear."""
    return (torch.randn(n, FEATURES, generator=generator, dtype=torch.float64),
            torch.randint(0, CLASSES, (n,), generator=generator))


def classes_up_to_49(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    targets = torch.randint(0, 50, (n,), generator=generator)
    targets[0] = 49
    return torch.randn(n, FEATURES, generator=generator), targets


class BrokenBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise ValueError("this model's backward is not written yet")


class NoBackward(nn.Module):
    """Steps forward (the model check's step) but not backward (the planner's): its own error."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return BrokenBackward.apply(self.lin(x))


def _inputs(data: str) -> Any:
    return inputs_of({"_target_": f"{HERE}.TextClassifier"}, DataConfig(name="custom", target=data))


@pytest.fixture(params=["cpu", "meta"])
def stepped_on(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each check both ways: a small model on the CPU, a large one on the meta device (as if over the limit)."""
    model_check._check.cache_clear()
    if request.param == "meta":
        monkeypatch.setattr(model_check, "SMALL_MODEL_BYTES", 0)
    yield request.param
    model_check._check.cache_clear()


def test_an_id_beyond_the_embedding_is_refused_naming_the_batch_factory(stepped_on):
    with pytest.raises(ConfigError) as info:
        check_model({"_target_": f"{HERE}.TextClassifier", "vocab": 10}, _inputs(f"{HERE}.ids_below_1000"), 32)
    assert info.value.key == "data._target_" and info.value.value == f"{HERE}.ids_below_1000"
    assert str(info.value).endswith("(IndexError: index out of range in self: ids up to 999 for embedding, an "
                                    "nn.Embedding of 10 (ids 0 to 9))"), info.value
    check_model({"_target_": f"{HERE}.TextClassifier", "vocab": 1000}, _inputs(f"{HERE}.ids_below_1000"), 32)


@pytest.mark.parametrize(("batches", "words"), [
    ("float64_features", "inputs of torch.float64 for inp, an nn.Linear of torch.float32 weights"),
    ("classes_up_to_49", r"IndexError: Target 49 is out of bounds: targets up to 49 for an output of 8 classes"),
])
def test_a_dtype_or_a_target_the_model_cannot_take_is_refused(stepped_on, batches, words):
    inputs = inputs_of({"_target_": "examples.custom_workload.build"}, DataConfig(name="custom", target=f"{HERE}.{batches}"))
    with pytest.raises(ConfigError, match=words) as info:
        check_model({"_target_": "examples.custom_workload.build"}, inputs, 32)
    assert info.value.key == "data._target_" and "a batch examples.custom_workload.build takes (" in str(info.value)


def test_a_model_that_takes_its_batches_passes_either_way(stepped_on):
    inputs = inputs_of({"_target_": "examples.custom_workload.build"},
                       DataConfig(name="custom", target="examples.custom_workload.batches"))
    built = check_model({"_target_": "examples.custom_workload.build"}, inputs, 32)
    assert {p.device.type for p in built.parameters()} == {"meta"}  # nothing kept of the step
    assert not any(m._forward_pre_hooks for m in built.modules())  # the checks' hooks removed


def test_ctrl_c_during_the_check_is_not_caught(monkeypatch):
    """KeyboardInterrupt goes through as it is (the entry point ends with one line and exit 130)."""
    model_check._check.cache_clear()

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(model_check, "_step", interrupted)
    inputs = inputs_of({"_target_": "examples.custom_workload.build"},
                       DataConfig(name="custom", target="examples.custom_workload.batches"))
    with pytest.raises(KeyboardInterrupt):
        check_model({"_target_": "examples.custom_workload.build", "width": 8}, inputs, 32)
    model_check._check.cache_clear()


def _plan(*overrides: str) -> Any:
    from harness.compose import compose_one, hydra_context
    from harness.launch.decide import run_plan
    from harness.launch.placement import probe_hardware

    with hydra_context():
        composed = compose_one(["strategy=single", *overrides])
    return run_plan(composed.run, probe_hardware(), resolved=composed.config)


CUSTOM_DATA = ("data=custom", "data._target_=examples.custom_workload.batches")


def test_the_users_model_raising_in_the_planner_is_refused_in_one_line():
    """Its forward passes the model check; its backward raises in the planner's trace: the run would fail too."""
    from harness.launch.runner import predict_run

    plan = _plan("model=custom", f"model._target_={HERE}.NoBackward", *CUSTOM_DATA)
    with pytest.raises(ConfigError) as info:
        predict_run(plan, quiet=True)
    message = str(info.value)
    assert info.value.key == "model._target_" and "\n" not in message, message
    assert "raised in its own code, at test_model_check.py:" in message and "in backward" in message, message
    assert "ValueError: this model's backward is not written yet" in message, message


@pytest.mark.parametrize(("model", "why"), [(("model=tiny_cnn",), "a bug of the planner's on a shipped model"),
                                            (("model=custom", "model._target_=examples.custom_workload.build",
                                              *CUSTOM_DATA), "the planner's trace cannot step this model")])
def test_a_planner_failure_of_its_own_is_a_warning(model, why, monkeypatch, caplog):
    """The harness's own error (here the planner's, raised in harness/prediction) never refuses a run."""
    from harness.launch import runner
    from harness.prediction import predict

    def broken(*args: Any) -> None:
        raise RuntimeError("the planner's own bug")

    monkeypatch.setattr(predict, "predict", broken)
    plan = _plan(*model)
    with caplog.at_level(logging.WARNING, logger=runner.__name__):
        assert runner.predict_run(plan) is None
    assert why in caplog.text and "RuntimeError: the planner's own bug" in caplog.text, caplog.text


def test_a_limit_of_the_trace_in_the_users_code_is_not_its_error():
    """A value read back from a meta tensor fails in the planner only: the real run reads it."""
    model = {"_target_": f"{HERE}.NoBackward"}
    try:
        torch.zeros(1, device="meta").item()
    except RuntimeError as error:
        assert raised_in_users_code(model, error) is None
    try:
        NoBackward()(torch.randn(2, FEATURES)).sum().backward()
    except ValueError as error:
        assert raised_in_users_code(model, error).startswith("at test_model_check.py:")
        assert raised_in_users_code({"_target_": "harness.rank.models.TinyCNN"}, error) is None  # shipped


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "line"), [
    (("model=custom", f"model._target_={HERE}.TextClassifier", "+model.vocab=10", "data=custom",
      f"data._target_={HERE}.ids_below_1000"),
     f"error: data._target_={HERE}.ids_below_1000 is not allowed: a batch {HERE}.TextClassifier takes (IndexError: "
     f"index out of range in self: ids up to 999 for embedding, an nn.Embedding of 10 (ids 0 to 9))"),
    (("model=custom", f"model._target_={HERE}.NoBackward", *CUSTOM_DATA),
     f"error: model._target_={HERE}.NoBackward is not allowed: a model whose training step runs: [single O0] the "
     f"planner's step of it raised in its own code, at test_model_check.py:"),
], ids=["embedding", "planner"])
def test_refused_by_run_py_in_one_line(overrides, line, tmp_path):
    """The issue's case end to end (the model check), and the planner's (its prediction made before launch): one
    line, exit 2, nothing written."""
    from conftest import describe, run_cli

    proc, results = run_cli(*overrides, "strategy=single", "plan.predict=true", tmp_path=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(line), describe(proc)
    assert results is None and not (tmp_path / "run").exists()
