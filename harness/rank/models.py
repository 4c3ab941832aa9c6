"""Models by name: any torchvision classification model is one yaml away, plus a tiny CNN for tests."""

from __future__ import annotations

import torchvision
from torch import nn


def torchvision_model(name: str, num_classes: int) -> nn.Module:
    """Randomly initialised (no weights are downloaded): speed and memory do not depend on them."""
    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        raise ValueError(f"model.name={name} is not a torchvision classification model; e.g. "
                         + ", ".join(n for n in available if n.startswith("resnet")))
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


class TinyCNN(nn.Module):
    """conv-bn-relu twice, pool, linear: batch-norm included so amp levels differ as on real models."""

    def __init__(self, num_classes: int, width: int = 8, name: str = "tiny_cnn") -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(2 * width, num_classes)

    def forward(self, x):  # noqa: ANN001, ANN201
        return self.classifier(self.features(x))
