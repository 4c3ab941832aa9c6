"""The one answer to "can this combination run, and how?": a `RunPlan`, built here and nowhere else.

Every caller asks this function: the pre-flight checks of a command line (harness.cli, which keeps each plan
for its job: harness.launch.checked), the torchrun worker, `plan=true` and the report's projection on a preset
(harness.launch.on_preset). A job that was not checked in this process decides its own (`plan_from_dict`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hydra.utils import get_class

from amp import plugin_class, resolve
from harness.core.config import RunConfig
from harness.core.errors import ConfigError, Incompatible
from harness.core.inputs import inputs_of
from harness.launch.model_check import check_model
from harness.launch.placement import Hardware, TorchrunWorld, place, probe_hardware
from harness.rank.run_plan import RunPlan
from harness.rank.token_file import check_token_file


def run_plan(cfg: RunConfig, hw: Hardware, *, resolved: Mapping[str, Any] | None = None, in_sweep: bool = False,
             torchrun: TorchrunWorld | None = None, installed_here: bool = True) -> RunPlan:
    """Place the run, resolve its amp level and say whether it runs. Raises ConfigError for bad input and
    Incompatible for a combination that cannot run correctly; a combination with nothing to measure here, or
    whose optional package is missing (checked only where `installed_here`: not for a preset), comes back
    with its reason.

    One-process strategies run inside the parent for a single run. In sweeps, and for every repeat, each run
    gets a fresh process, so no run inherits the memory, threads or CUDA context of the one before."""
    strategy_cls = get_class(cfg.strategy["_target_"])
    launched = strategy_cls.one_process_per_device or in_sweep or (cfg.repeat or 1) > 1
    placement = place(cfg, hw, strategy_cls.one_process_per_device, strategy_cls.drives_all_devices,
                      strategy_cls.needs_cuda, isolated=launched, torchrun=torchrun,
                      tensor_parallel=strategy_cls.traffic(cfg.strategy).tensor_parallel)
    amp = resolve(cfg.amp, placement.accelerator)
    if placement.local_batch % cfg.grad_accum:
        raise ConfigError("grad_accum", cfg.grad_accum, f"a divisor of each process's batch of {placement.local_batch} "
                          f"(batch_size {cfg.batch_size} over {placement.data_shards} data-parallel share(s))")
    strategy_cls.check_compatible(placement, amp)
    strategy_cls.check_run(cfg, placement, amp)
    if placement.accelerator == "cuda" and launched and torchrun is None \
            and cfg.launcher.name == "spawn" and cfg.launcher.start_method == "fork":
        raise Incompatible("launcher.start_method", "fork", "spawn or forkserver on GPUs: this process has already "
                           "asked CUDA for its devices, and a forked child cannot re-initialise CUDA")
    inputs = inputs_of(cfg.model, cfg.data)
    built = check_model(cfg.model, inputs, cfg.data.image_size)
    strategy_cls.check_built(cfg, placement, built)
    notes = strategy_cls.model_notes(cfg.strategy, built)
    if notes:
        placement = dataclasses.replace(placement, notes=(*placement.notes, *notes))
    if inputs.kind != "images" and cfg.data.name == "loader":
        raise ConfigError("data", cfg.data.name, f"synthetic for model={cfg.model_name}, which takes {inputs.kind}: "
                          "data=loader reads image folders")
    if cfg.data.name == "tokens":
        if inputs.kind != "tokens" or inputs.factory is not None:
            raise ConfigError("data", cfg.data.name, f"synthetic or loader for model={cfg.model_name}, which takes "
                              f"{inputs.kind}: data=tokens feeds a language model (model=gpt)")
        check_token_file(cfg.data, inputs)
    amp_cls = plugin_class(cfg.amp_plugin)
    skip = strategy_cls.skip_reason(placement, amp) or amp_cls.skip_reason(amp, placement.accelerator)
    missing = (strategy_cls.unavailable_reason() or amp_cls.unavailable_reason(amp, placement.accelerator)) \
        if installed_here else None
    return RunPlan(config=cfg, resolved=dict(resolved or {}), strategy_cls=strategy_cls, placement=placement, amp=amp,
                   launched=launched or torchrun is not None, inputs=inputs,
                   skip=skip, unavailable=missing)


def plan_from_dict(resolved: Mapping[str, Any], strategy_name: str, *, in_sweep: bool,
                   hw: Hardware | None = None) -> RunPlan:
    """The plan of a config composed elsewhere (a submitit job's, a test's, a benchmark's): checked and
    decided here, once."""
    cfg = RunConfig.from_dict(resolved, strategy_name)
    return run_plan(cfg, hw or probe_hardware(), resolved=resolved, in_sweep=in_sweep)
