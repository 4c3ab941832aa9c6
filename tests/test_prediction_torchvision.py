"""Every torchvision classification model plans on a preset at its own image size (harness.prediction.trace's builds on
fake tensors and on the meta device, harness.launch.model_check's meta build), or is refused in one line."""

from __future__ import annotations

import pytest
import torchvision
from conftest import run_config

from harness.launch.on_preset import predict_on
from harness.prediction.trace import on_meta

MODELS = torchvision.models.list_models(module=torchvision.models)
# one of each way a model once failed to plan: ConvNeXt (trunc_normal_ on fake tensors, as ViT's), RegNet (widths
# from torch.arange on the meta device), Inception v3 (auxiliary logits, as GoogLeNet's; its 299 px). ViT and
# GoogLeNet are planned with every other model under `-m bench`
ONCE_FAILED = ("convnext_tiny", "regnet_x_400mf", "inception_v3")


def own_image_size(name: str) -> int:
    """The size the model is built for where it says so (a ViT built without weights: 224, though vit_h_14's
    weights were evaluated at 518), else the crop its published weights were evaluated at (torchvision's weights
    metadata; nothing is downloaded)."""
    built = getattr(on_meta(lambda: torchvision.models.get_model(name, weights=None)), "image_size", None)
    transforms = torchvision.models.get_model_weights(name).DEFAULT.transforms
    return int(built or transforms.keywords.get("crop_size", 224))


def plan(name: str) -> dict:
    cfg = run_config("single", batch_size=2, amp={"level": "O1"},
                     model={"_target_": "harness.rank.models.torchvision_model", "name": name},
                     data={"name": "synthetic", "image_size": own_image_size(name), "num_classes": 1000},
                     plan={"calibration": "model", "predict": True, "hardware": "a100x8"})
    return predict_on(cfg, "a100x8", 2)


@pytest.mark.parametrize("name", ONCE_FAILED)
def test_the_models_that_once_failed_plan_on_a_preset(name):
    row = plan(name)
    assert row["status"] == "predicted" and row["reason"] is None, row
    assert row["prediction"]["throughput_img_s"] > 0 and row["prediction"]["fits"]


@pytest.mark.bench
@pytest.mark.slow  # minutes in all, though no process starts: out of `-m "not slow"`, which replaces "not bench"
@pytest.mark.parametrize("name", [m for m in MODELS if m not in ONCE_FAILED])
def test_every_torchvision_classification_model_plans_on_a_preset(name):
    """All of them (about 10 minutes): `python -m pytest -m bench tests/test_prediction_torchvision.py`."""
    row = plan(name)
    assert row["status"] == "predicted" and row["reason"] is None, row
