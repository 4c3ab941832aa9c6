"""A combination placed and predicted on a hardware preset (or this machine) as it would run there: refused or
skipped for the reasons a run would be, then predicted (harness.prediction). Used by `plan=true` and by the
report's projection (`--project`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hydra.utils import get_class

from harness.core.config import RunConfig
from harness.core.errors import Incompatible
from harness.launch.decide import run_plan
from harness.launch.placement import Hardware, TorchrunWorld, probe_hardware
from harness.launch.runner import variant_fields
from harness.prediction.hardware import LOCAL, load_preset
from harness.prediction.links import Link
from harness.prediction.predict import NotPredictable, predict
from harness.prediction.targets import local_target, preset_target
from harness.rank.run_plan import RunPlan

LinkMeasure = Callable[[int, int], tuple[Link, dict[str, Link]]]  # this machine's link: (ranks, calls a size)


def decide_on(cfg: RunConfig, hardware: str, cores: int) -> RunPlan:
    """The combination placed on the preset's devices (or this machine's) as a run would be there: Incompatible
    where it cannot run at all."""
    local = hardware == LOCAL
    if local:
        hw, torchrun = probe_hardware(), None
    else:
        preset = load_preset(hardware, nodes=cfg.plan.nodes)
        hw = Hardware(visible_gpus=tuple(range(preset.devices_per_node)) if preset.accelerator == "cuda" else (),
                      cores=cores)
        one_per_device = get_class(cfg.strategy["_target_"]).one_process_per_device
        torchrun = TorchrunWorld(local_world_size=preset.devices_per_node, nodes=preset.nodes, node_rank=0) \
            if preset.nodes > 1 and one_per_device else None
    # here, what is not installed does not run either; on a preset it is the user's to install
    return run_plan(cfg, hw, in_sweep=True, torchrun=torchrun, installed_here=local)


def predict_on(cfg: RunConfig, hardware: str, cores: int, measure_link: LinkMeasure | None = None) -> dict[str, Any]:
    """A row: the combination, `status` (predicted, skipped, not predicted), `reason`, and the prediction."""
    row: dict[str, Any] = {"strategy": cfg.strategy_name, "amp": cfg.amp.level, "model": cfg.model_name,
                           "variant": variant_fields(cfg).variant,
                           "hardware": f"{hardware}*{cfg.plan.nodes}" if cfg.plan.nodes else hardware,
                           "global_batch": cfg.batch_size}
    local = hardware == LOCAL
    try:
        decided = decide_on(cfg, hardware, cores)
    except Incompatible as error:
        return {**row, "status": "skipped", "reason": str(error)}
    reason = decided.skipped_because()
    if reason:
        return {**row, "status": "skipped", "reason": reason}
    placement, ranks = decided.placement, decided.device_ranks
    if local:
        target = local_target(placement.accelerator, ranks, placement.threads_per_process,
                              (lambda: measure_link(ranks, cfg.plan.link_repeats)) if measure_link else None)
    else:
        target = preset_target(hardware, cores, cfg.plan.nodes)
    try:
        prediction = predict(cfg, placement, decided.amp, decided.strategy_cls, target)
    except NotPredictable as error:
        return {**row, "status": "not predicted", "reason": str(error)}
    return {**row, "status": "predicted", "world_size": ranks, "reason": prediction.misfit(),
            "prediction": prediction.as_dict()}
