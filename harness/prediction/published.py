"""Published GPU training results (published.csv beside this module), the workloads they ran, and the fit of
harness.prediction.gpu_model's few factors to them, with a leave-one-out check.

Each row of the table names its source (repository, file, table) and what was run: the workload (ResNet-50,
BERT-large fine-tuned on SQuAD), the GPU (a preset of conf/plan/hardware/), how many, the precision as the
source states it, the batch per GPU, real or synthetic data, and the throughput. The workloads are rebuilt here
at their published shapes with random weights (torchvision's ResNet-50; BERT-large as the compact definition
below, with the unfused attention those runs used), traced once on tensors with no data, and timed on the
preset by the GPU model; the factors minimise the squared log error over the table. A case's leave-one-out
prediction uses factors fitted without it: what the model does on a figure it has not seen."""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.core.amp_levels import AmpSpec
from harness.prediction.gpu_model import GpuFactors, StepOps, step_time, straggle
from harness.prediction.hardware import Preset, load_preset
from harness.prediction.links import collective_seconds
from harness.prediction.predict import FORWARD_SHARE

TABLE = Path(__file__).with_name("published.csv")
COLUMNS = ("workload", "gpu", "gpus", "precision", "memory_format", "batch_per_gpu", "seq_len", "data", "published",
           "unit", "source", "where")
PRECISIONS = {  # as the sources state them: the amp level, its dtype, and whether TF32 serves float32 matmuls
    "fp32": ("O0", "float32", False), "tf32": ("O0", "float32", True), "amp": ("O1", "float16", True),
    "fp16-o2": ("O2", "float16", True), "bf16": ("O1", "bfloat16", True)}
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket: the last one is waited for


@dataclass(frozen=True)
class Case:
    workload: str
    gpu: str  # a preset of conf/plan/hardware/
    gpus: int
    precision: str  # a key of PRECISIONS
    memory_format: str  # nchw | nhwc (channels_last) for images; empty otherwise
    batch_per_gpu: int
    seq_len: int  # 0 for images
    data: str  # real | synthetic
    published: float  # samples per second, all GPUs
    unit: str
    source: str
    where: str

    @property
    def name(self) -> str:
        seq = f" seq {self.seq_len}" if self.seq_len else ""
        return f"{self.workload} {self.gpu} x{self.gpus} {self.precision} b{self.batch_per_gpu}{seq}"


def load_table(path: Path = TABLE) -> list[Case]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(line for line in handle if not line.startswith("#"))
        rows = list(reader)
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ValueError(f"{path}: columns {reader.fieldnames}, expected {list(COLUMNS)}")
    return [Case(row["workload"], row["gpu"], int(row["gpus"]), row["precision"], row["memory_format"],
                 int(row["batch_per_gpu"]),
                 int(row["seq_len"] or 0), row["data"], float(row["published"]), row["unit"], row["source"],
                 row["where"]) for row in rows]


# ---- the workloads, at their published shapes ----

class BertSelfAttention(nn.Module):
    """Attention as BERT's reference code (and NVIDIA's BERT of those tables) computes it: scores
    materialised, softmax, dropout, then the values."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
        context = self.dropout(scores.softmax(-1)) @ v
        return self.out(context.transpose(1, 2).reshape(batch, seq, width))


class BertLayer(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.attention = BertSelfAttention(width, heads, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.feed = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.attention(x)))
        return self.norm2(x + self.dropout(self.feed(x)))


class BertForSquad(nn.Module):
    """BERT (post-norm encoder) with SQuAD's span head: start and end logits per token."""

    def __init__(self, layers: int = 24, width: int = 1024, heads: int = 16, vocab: int = 30522,
                 positions: int = 512, dropout: float = 0.1) -> None:
        super().__init__()
        self.words, self.positions = nn.Embedding(vocab, width), nn.Embedding(positions, width)
        self.types = nn.Embedding(2, width)
        self.norm = nn.LayerNorm(width)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.Sequential(*(BertLayer(width, heads, dropout) for _ in range(layers)))
        self.span = nn.Linear(width, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        where = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.dropout(self.norm(self.words(tokens) + self.positions(where) + self.types(torch.zeros_like(tokens))))
        return self.span(self.layers(x))


def span_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (F.cross_entropy(logits[..., 0], targets[:, 0]) + F.cross_entropy(logits[..., 1], targets[:, 1])) / 2


@dataclass(frozen=True)
class Workload:
    build: Callable[[], nn.Module]
    batch: Callable[[int, int, torch.device], tuple[torch.Tensor, torch.Tensor]]  # (batch, seq_len, device)
    loss: Callable[[Any, torch.Tensor], torch.Tensor]
    optimizer: tuple[str, dict[str, Any]]


def _torchvision(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision

        return torchvision.models.get_model(name)

    return build


def resnext101_32x4d(num_classes: int = 1000, block: type | None = None) -> nn.Module:
    """ResNeXt-101 32x4d (torchvision ships 32x8d and 64x4d): its ResNet with 32 groups of 4 channels. Also a
    model a user can name: `model._target_=harness.prediction.published.resnext101_32x4d`."""
    from torchvision.models.resnet import Bottleneck, ResNet

    return ResNet(block or Bottleneck, [3, 4, 23, 3], num_classes=num_classes, groups=32, width_per_group=4)


def se_resnext101_32x4d(num_classes: int = 1000) -> nn.Module:
    """SE-ResNeXt-101 32x4d as DeepLearningExamples trains it: each bottleneck's output rescaled per channel by a
    squeeze-and-excitation gate (average pool, a 16x bottleneck of 1x1 convolutions, a sigmoid) before the
    residual addition."""
    from torchvision.models.resnet import Bottleneck

    class SqueezeExcitation(Bottleneck):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            channels = self.conv3.out_channels
            self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, channels // 16, 1),
                                      nn.ReLU(inplace=True), nn.Conv2d(channels // 16, channels, 1), nn.Sigmoid())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            out = out * self.gate(out)
            return self.relu(out + (self.downsample(x) if self.downsample is not None else x))

    return resnext101_32x4d(num_classes, SqueezeExcitation)


def _images(size: int) -> Callable[[int, int, torch.device], tuple[torch.Tensor, torch.Tensor]]:
    def batch(batch: int, _seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(batch, 3, size, size, device=device),
                torch.randint(0, 1000, (batch,), device=device))

    return batch


def _tokens(batch: int, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 30522, (batch, seq), device=device), torch.randint(0, seq, (batch, 2), device=device)


IMAGENET_SGD = ("torch.optim.SGD", {"lr": 0.1, "momentum": 0.875, "weight_decay": 3.05e-5})  # DLE's ConvNets
IMAGENET_RMSPROP = ("torch.optim.RMSprop", {"lr": 0.08, "alpha": 0.9, "eps": 0.01, "momentum": 0.9,
                                             "weight_decay": 1e-5})  # DLE's EfficientNets (configs.yml)
SQUAD_ADAMW = ("torch.optim.AdamW", {"lr": 3e-5})
WORKLOADS = {
    "resnet50": Workload(_torchvision("resnet50"), _images(224), F.cross_entropy, IMAGENET_SGD),
    "resnext101_32x4d": Workload(resnext101_32x4d, _images(224), F.cross_entropy, IMAGENET_SGD),
    "se_resnext101_32x4d": Workload(se_resnext101_32x4d, _images(224), F.cross_entropy, IMAGENET_SGD),
    "efficientnet_b0": Workload(_torchvision("efficientnet_b0"), _images(224), F.cross_entropy,
                                IMAGENET_RMSPROP),
    "efficientnet_b4": Workload(_torchvision("efficientnet_b4"), _images(380), F.cross_entropy, IMAGENET_RMSPROP),
    "bert_large_squad": Workload(BertForSquad, _tokens, span_loss, SQUAD_ADAMW),
    "bert_base_squad": Workload(functools.partial(BertForSquad, layers=12, width=768, heads=12), _tokens, span_loss,
                                SQUAD_ADAMW),
}
FAMILIES = {"resnet50": "resnet", "resnext101_32x4d": "resnet", "se_resnext101_32x4d": "resnet",
            "efficientnet_b0": "efficientnet", "efficientnet_b4": "efficientnet", "bert_large_squad": "bert",
            "bert_base_squad": "bert"}  # architecture families, held out whole (benchmark 14)


def amp_for(precision: str) -> AmpSpec:
    """What the source's precision means as an amp level (apex's table, harness.core.amp_levels)."""
    from harness.core.amp_levels import AmpConfig, resolve

    level, dtype, _ = PRECISIONS[precision]
    return resolve(AmpConfig(level=level, dtype=dtype if level != "O0" else "auto"), "cuda")


@functools.lru_cache(maxsize=64)
def case_ops(workload: str, precision: str, batch: int, seq_len: int) -> tuple[StepOps, int]:
    """The case's step as operators, and the bytes of the gradients DDP all-reduces."""
    from amp import OptimizerSpec
    from harness.prediction.trace import workload_ops

    spec = WORKLOADS[workload]
    cls, kwargs = spec.optimizer
    optim = OptimizerSpec.from_config({"_target_": cls, **kwargs})
    ops = workload_ops(spec.build, lambda device: spec.batch(batch, seq_len, device), spec.loss,
                       amp_for(precision), optim, 1, batch)
    with torch.device("meta"):
        grads = sum(p.numel() * 4 for p in spec.build().parameters())  # fp32: every level here keeps them so
    return ops, grads


def predict_case(case: Case, factors: GpuFactors, preset: Preset | None = None) -> float:
    """Samples per second over all the case's GPUs."""
    preset = preset or load_preset(case.gpu)
    ops, grad_bytes = case_ops(case.workload, case.precision, case.batch_per_gpu, case.seq_len)
    time = step_time(ops, preset.peak_tflops, preset.memory_gbps, factors, tf32_matmul=PRECISIONS[case.precision][2],
                     channels_last=case.memory_format == "nhwc", kernel_share=preset.kernel_share)
    step = (time.forward_backward_s + time.optimizer_s) * straggle(case.gpus, factors)
    if case.gpus > 1:  # DDP: one all-reduce of the gradients, under backward (hidden at the share `overlap`)
        seconds = collective_seconds("all_reduce", grad_bytes, min(case.gpus, preset.devices_per_node),
                                     max(1, math.ceil(case.gpus / preset.devices_per_node)), preset.intra,
                                     preset.inter, {}, "float32")
        last = seconds * min(1.0, BUCKET_BYTES / grad_bytes)  # the last bucket waits for backward's end
        covered = min(seconds - last, time.forward_backward_s * (1 - FORWARD_SHARE))
        step += seconds - covered * factors.overlap
    return case.gpus * case.batch_per_gpu / step


# ---- the fit ----

PARAMETERS = ("conv", "matmul", "memory", "launch_us", "sync_cv", "nchw", "grouped", "depthwise", "norm", "attention",
              "overlap")
DISPATCH_US = 10.0  # not fitted: every published case is GPU-bound (harness.prediction.gpu_model.GpuFactors.dispatch_us)
BOUNDS = ((0.02, 2.0), (0.02, 1.0), (0.05, 1.0), (0.5, 60.0), (0.0, 0.3), (0.0, 8.0), (0.02, 1.0), (0.01, 1.0),
          (0.05, 1.0), (0.05, 1.0), (0.0, 1.0))
# where the fit starts, and what a factor the cases cannot tell stays near (PRIOR): matmul 0.9 of a preset's
# kernel_share, the published best matmul rate (MAMF), which a training step's large products come close to
START = (0.5, 0.9, 0.6, 8.0, 0.03, 1.0, 0.5, 0.3, 0.5, 0.5, 0.8)
# a weak pull of each factor towards its start, as a residual of PRIOR x (factor - start) / start: negligible
# beside a hundred cases' log errors for a factor they tell, it keeps one they cannot (the matmul factor when no
# transformer is in the fit: benchmark 14's families held out) from drifting to a bound
PRIOR = 0.05
# a published figure predicted by a function of the factors (harness.launch.published_llm's language-model runs,
# planned through the whole planner): None where it would not run
Extra = tuple[float, Callable[[GpuFactors], "float | None"]]


# fitted only with the language-model runs: no image or BERT result runs fused attention, and the image results'
# all-reduces (DDP, 8 GPUs of one node) are small beside their backward: what compute hides of a collective shows
# where FSDP gathers a model every micro-batch
LANGUAGE_MODEL_PARAMETERS = ("attention", "overlap")


def fitted_parameters(with_language_models: bool) -> tuple[str, ...]:
    """The factors a fit determines: LANGUAGE_MODEL_PARAMETERS only where language-model runs are in it (else
    their defaults: attention 0.5, overlap 1, every collective under compute hidden)."""
    return tuple(name for name in PARAMETERS if with_language_models or name not in LANGUAGE_MODEL_PARAMETERS)


def fit(cases: Sequence[Case], extra: Sequence[Extra] = ()) -> GpuFactors:
    """The factors minimising the squared log error of predicted over published throughput, over `cases` and
    `extra`. Without `extra` the LANGUAGE_MODEL_PARAMETERS keep their defaults."""
    import numpy as np
    from scipy.optimize import least_squares

    presets = {c.gpu: load_preset(c.gpu) for c in cases}

    names = fitted_parameters(bool(extra))
    fitted = [PARAMETERS.index(name) for name in names]
    start = np.array([START[i] for i in fitted])

    def factors_of(theta: Any) -> GpuFactors:
        return GpuFactors(**dict(zip(names, (float(t) for t in theta), strict=True)), dispatch_us=DISPATCH_US)

    def residuals(theta: Any) -> Any:
        f = factors_of(theta)
        own = [math.log(predict_case(c, f, presets[c.gpu]) / c.published) for c in cases]
        more = [math.log((predicted(f) or published) / published) for published, predicted in extra]
        return np.array(own + more + list(PRIOR * (theta - start) / start))

    lower, upper = zip(*(BOUNDS[i] for i in fitted), strict=True)
    result = least_squares(residuals, start, bounds=(lower, upper), x_scale=start + 0.01)
    return dataclasses.replace(factors_of(result.x), cases=len(cases) + len(extra))


@dataclass(frozen=True)
class Check:
    case: Case
    fitted: float  # predicted by the factors fitted to every case
    left_out: float  # predicted by factors fitted without this case

    @property
    def error(self) -> float:
        """(predicted - published) / published, left out."""
        return self.left_out / self.case.published - 1


def leave_one_out(cases: Sequence[Case]) -> tuple[GpuFactors, list[Check]]:
    """The factors from every case, with the fit's leave-one-out SD of log errors as its band, and each case's
    check."""
    whole = fit(cases)
    checks = [Check(c, predict_case(c, whole), predict_case(c, fit([o for o in cases if o is not c])))
              for c in cases]
    return dataclasses.replace(whole, log_sd=log_rms(checks)), checks


def family(case: Case) -> str:
    """The architecture family of a case's workload (ResNet-50 and the ResNeXts are one; so are the BERTs)."""
    return FAMILIES[case.workload]


def gpu_type(case: Case) -> str:
    """The GPU a case ran on (its preset's name without the count: h100x8 -> h100, rtx4090x8 -> rtx4090)."""
    return re.sub(r"x\d+(-.*)?$", "", case.gpu)


def leave_group_out(cases: Sequence[Case], group: Callable[[Case], str], whole: GpuFactors,
                    ) -> dict[str, list[Check]]:
    """For each group (a workload family, a GPU type), its cases predicted by factors fitted without any case of it:
    what the model does on an architecture or a GPU it was not fitted on. A group whose removal leaves no case to
    fit is not held out."""
    held: dict[str, list[Check]] = {}
    for name in sorted({group(c) for c in cases}):
        rest = [c for c in cases if group(c) != name]
        if not rest:
            continue
        without = fit(rest)
        held[name] = [Check(c, predict_case(c, whole), predict_case(c, without)) for c in cases if group(c) == name]
    return held


def log_rms(checks: Sequence[Check]) -> float:
    """The RMS of log(left-out prediction / published): the band's width, x1.645 for 90 %."""
    logs = [math.log(c.left_out / c.case.published) for c in checks]
    return math.sqrt(sum(x * x for x in logs) / len(logs)) if logs else 0.0
