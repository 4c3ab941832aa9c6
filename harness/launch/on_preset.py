"""A combination placed and predicted on a hardware preset (or this machine) as it would run there: refused or
skipped for the reasons a run would be, then predicted (harness.plan). Used by `plan=true` and by the
report's projection (`--project`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hydra.utils import get_class

from harness.core.config import RunConfig
from harness.core.errors import Incompatible
from harness.launch.placement import Hardware, TorchrunWorld, probe_hardware
from harness.launch.runner import plan as place_run
from harness.launch.runner import variant_fields
from harness.plan.hardware import LOCAL, load_preset
from harness.plan.links import Link
from harness.plan.predict import NotPredictable, predict
from harness.plan.targets import local_target, preset_target

LinkMeasure = Callable[[int], tuple[Link, dict[str, Link]]]  # measures this machine's link over n ranks


def predict_on(cfg: RunConfig, hardware: str, cores: int, measure_link: LinkMeasure | None = None) -> dict[str, Any]:
    """A row: the combination, `status` (predicted, skipped, not predicted), `reason`, and the prediction."""
    strategy_cls = get_class(cfg.strategy["_target_"])
    row: dict[str, Any] = {"strategy": cfg.strategy_name, "amp": cfg.amp.level, "model": cfg.model_name,
                           "variant": variant_fields(cfg)["variant"], "hardware": hardware,
                           "global_batch": cfg.batch_size}
    try:
        if hardware == LOCAL:
            hw, torchrun = probe_hardware(), None
        else:
            preset = load_preset(hardware)
            hw = Hardware(visible_gpus=tuple(range(preset.devices_per_node)) if preset.accelerator == "cuda" else (),
                          cores=cores)
            torchrun = TorchrunWorld(local_world_size=preset.devices_per_node, nodes=preset.nodes, node_rank=0) \
                if preset.nodes > 1 and strategy_cls.one_process_per_device else None
        decided = place_run(cfg, hw, in_sweep=True, torchrun=torchrun)
    except Incompatible as error:
        return {**row, "status": "skipped", "reason": str(error)}
    placement, amp = decided.placement, decided.amp
    amp_cls = get_class(cfg.amp_plugin)
    reason = strategy_cls.skip_reason(placement, amp) or amp_cls.skip_reason(amp, placement.accelerator)
    if reason is None and hardware == LOCAL:  # here, what is not installed does not run either
        reason = strategy_cls.unavailable_reason() or amp_cls.unavailable_reason(amp, placement.accelerator)
    if reason:
        return {**row, "status": "skipped", "reason": f"strategy={cfg.strategy_name}: {reason}"}
    ranks = len(placement.gpus) if strategy_cls.drives_all_devices and placement.gpus else placement.world_size
    if hardware == LOCAL:
        target = local_target(placement.accelerator, ranks, placement.threads_per_process,
                              (lambda: measure_link(ranks)) if measure_link else None)
    else:
        target = preset_target(hardware, cores)
    try:
        prediction = predict(cfg, placement, amp, strategy_cls, target)
    except NotPredictable as error:
        return {**row, "status": "not predicted", "reason": str(error)}
    return {**row, "status": "predicted", "world_size": ranks, "reason": prediction.misfit(),
            "prediction": prediction.as_dict()}

