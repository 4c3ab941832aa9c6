"""Models by name: any torchvision classification model is one yaml away, a vision transformer at a size of one's
own, and a tiny CNN for tests (the language model is harness/rank/gpt.py)."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from typing import Any, Literal

from torch import nn

from harness.core.config import DataConfig
from harness.core.errors import ConfigError
from harness.core.inputs import Inputs, bound_options, images


def torchvision_model(name: str, num_classes: int) -> nn.Module:
    """Randomly initialised (no weights are downloaded): speed and memory do not depend on them. torchvision is
    imported here: it takes a second and a half (it imports torch._dynamo), which a TinyCNN run never needs."""
    import torchvision

    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        close = difflib.get_close_matches(name, available, n=3)
        raise ConfigError("model.name", name, "a torchvision classification model, e.g. "
                          + ", ".join(close or [n for n in available if n.startswith("resnet")]))
    # GoogLeNet and Inception v3 return their auxiliary classifiers' logits beside the main ones when training;
    # trained on the main output alone (one loss, as every other model here), they are built without them
    auxiliary = {"aux_logits": False} if name in ("googlenet", "inception_v3") else {}
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes, **auxiliary)


class TinyCNN(nn.Module):
    """conv-bn-relu twice, pool, linear: batch-norm included so amp levels differ as on real models.
    `norm="none"` leaves batch-norm out (convolutions with a bias instead): every sample's gradient then
    depends on that sample alone, so data-parallel strategies must match one device to float rounding
    (the strict numerical-parity check)."""

    def __init__(self, num_classes: int, width: int = 8, name: str = "tiny_cnn",
                 norm: Literal["batch", "none"] = "batch") -> None:
        super().__init__()
        if norm not in ("batch", "none"):
            raise ValueError(f"model.norm={norm} is not allowed: batch or none")

        def block(inputs: int, outputs: int) -> list[nn.Module]:
            if norm == "none":
                return [nn.Conv2d(inputs, outputs, 3, padding=1), nn.ReLU(inplace=True)]
            return [nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs),
                    nn.ReLU(inplace=True)]

        self.features = nn.Sequential(*block(3, width), *block(width, 2 * width), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten())
        self.classifier = nn.Linear(2 * width, num_classes)

    def forward(self, x):  # noqa: ANN001, ANN201
        return self.classifier(self.features(x))


def vit(num_classes: int, image_size: int = 32, patch_size: int = 8, layers: int = 2, heads: int = 4,
        width: int = 64, mlp_width: int = 128, name: str = "vit") -> nn.Module:
    """torchvision's VisionTransformer at a size of one's own, trained at its own input size (`image_size`: the
    batches are made at it, whatever data.image_size says). torchvision's vit_b_16 is image_size=224,
    patch_size=16, layers=12, heads=12, width=768, mlp_width=3072. Its encoder layers are its blocks."""
    return _vit_class()(image_size=image_size, patch_size=patch_size, num_layers=layers, num_heads=heads,
                        hidden_dim=width, mlp_dim=mlp_width, num_classes=num_classes)


def _vit_inputs(options: Mapping[str, Any], data: DataConfig) -> Inputs:
    """Images at the model's own `image_size` (harness/core/inputs.py's contract)."""
    return images(int(bound_options(vit, options)["image_size"]), data.num_classes)


vit.inputs = _vit_inputs  # type: ignore[attr-defined]


@functools.cache
def _vit_class() -> type[nn.Module]:
    """Made on first use: torchvision takes a second and a half to import."""
    from torchvision.models import VisionTransformer

    class ViT(VisionTransformer):
        def block_names(self) -> list[str]:
            return [f"encoder.layers.{name}" for name, _ in self.encoder.layers.named_children()]

    return ViT
