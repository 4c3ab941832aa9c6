"""Models by name: any torchvision classification model is one yaml away, plus a tiny CNN for tests."""

from __future__ import annotations

from typing import Literal

from torch import nn


def torchvision_model(name: str, num_classes: int) -> nn.Module:
    """Randomly initialised (no weights are downloaded): speed and memory do not depend on them. torchvision is
    imported here: it takes a second and a half (it imports torch._dynamo), which a TinyCNN run never needs."""
    import torchvision

    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        raise ValueError(f"model.name={name} is not a torchvision classification model; e.g. "
                         + ", ".join(n for n in available if n.startswith("resnet")))
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


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
