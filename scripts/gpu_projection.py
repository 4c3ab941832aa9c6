"""On a lent GPU: the GPU model's prediction (harness/prediction/gpu_model.py) against this GPU's own measurement, for a
few workloads at one device, so that the first GPU the project gets corrects the fitted factors.

    python scripts/gpu_projection.py OUT_DIR      (scripts/gpu_check.sh runs it)

Writes OUT_DIR/gpu-projection.md (measured, predicted, measured / predicted) and OUT_DIR/gpu-projection.csv:
the measurements as rows of harness/prediction/published.csv (source GPU-CHECK). Appending them there and running
`python bench/projection.py --fit --write-results` refits the factors with them. Each case is timed as the
harness times a run: warm-up steps apart, the device synchronized at the window's edges only."""

from __future__ import annotations

import csv
import dataclasses
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# (workload, precision, batch per GPU, sequence length): large steps and a small one (where dispatch shows)
CASES = (("resnet50", "tf32", 128, 0), ("resnet50", "amp", 256, 0), ("resnet50", "amp", 8, 0),
         ("bert_large_squad", "tf32", 16, 384), ("bert_large_squad", "fp16-o2", 32, 384))
PRESETS = (("H200", "h200x8"), ("H100", "h100x8"), ("A100", "a100x8"), ("V100", "v100x8"))
WARMUP, STEPS = 5, 20


def preset_for(device_name: str) -> str | None:
    """The shipped preset of a GPU by its name (torch.cuda.get_device_name), or None."""
    return next((preset for key, preset in PRESETS if key in device_name.upper()), None)


def measure(workload: str, precision: str, batch: int, seq_len: int) -> float:
    """Samples per second of the workload's training step on this GPU (one device)."""
    import torch

    from amp import OptimizerSpec
    from amp.native import NativeAmp
    from harness.prediction import published

    spec = published.WORKLOADS[workload]
    amp = published.amp_for(precision)
    torch.backends.cuda.matmul.allow_tf32 = published.PRECISIONS[precision][2]
    device = torch.device("cuda")
    plugin = NativeAmp(amp, device)
    model = plugin.cast_module(spec.build().to(device))
    cls, kwargs = spec.optimizer
    optimizer = OptimizerSpec.from_config({"_target_": cls, **kwargs, "foreach": True}).build(
        plugin.optimizer_params(model))
    model = plugin.wrap_module(model).train()
    inputs, targets = spec.batch(batch, seq_len, device)

    def step() -> None:
        with plugin.forward_context():
            loss = spec.loss(model(inputs), targets)
        plugin.backward(loss)
        plugin.step(optimizer)
        plugin.zero_grad(optimizer)

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(STEPS):
        step()
    torch.cuda.synchronize()
    return batch * STEPS / (time.perf_counter() - started)


def main(argv: list[str]) -> int:
    import torch

    from harness.prediction import published
    from harness.prediction.gpu_model import load_factors
    from harness.prediction.hardware import load_preset

    out = Path(argv[0]) if argv else REPO / "runs" / "gpu-projection"
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("gpu_projection: no CUDA GPU here: nothing measured", flush=True)
        return 0
    name = torch.cuda.get_device_name(0)
    preset = preset_for(name)
    if preset is None:
        (out / "gpu-projection.md").write_text(f"No preset for {name}: add conf/plan/hardware/<name>.yaml\n")
        print(f"gpu_projection: no preset for {name}", flush=True)
        return 0
    factors = load_factors()
    lines = [f"# The GPU model against {name} ({preset}), torch {torch.__version__}", "",
             "| case | measured | predicted | measured / predicted |", "|:---|---:|---:|---:|"]
    rows = []
    for workload, precision, batch, seq_len in CASES:
        case = published.Case(workload, preset, 1, precision, "nchw" if not seq_len else "", batch, seq_len,
                              "synthetic", 0.0, "seq/s" if seq_len else "img/s", "GPU-CHECK", name)
        try:
            measured = measure(workload, precision, batch, seq_len)
        except Exception as error:  # noqa: BLE001 (one case out of memory or unsupported: the others still count)
            lines.append(f"| {case.name} | failed: {str(error).splitlines()[0][:120]} | | |")
            continue
        rows.append(dataclasses.replace(case, published=round(measured, 1)))  # the measurement stands alone
        try:
            predicted = published.predict_case(case, factors, load_preset(preset))
        except Exception as error:  # noqa: BLE001 (the model's failure is a finding, not the end of the check)
            lines.append(f"| {case.name} | {measured:.1f} | failed: {str(error).splitlines()[0][:120]} | |")
            print(lines[-1], flush=True)
            continue
        lines.append(f"| {case.name} | {measured:.1f} | {predicted:.1f} | {measured / predicted:.3f} |")
        print(lines[-1], flush=True)
    (out / "gpu-projection.md").write_text("\n".join(lines) + "\n")
    with (out / "gpu-projection.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(published.COLUMNS)
        for r in rows:
            writer.writerow([getattr(r, c) for c in published.COLUMNS])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
