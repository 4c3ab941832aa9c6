"""The Hydra side of `run.py`: the `hw` resolver, the task function, and how errors become exit codes."""

from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.config import ConfigError, Incompatible, check_group_choices, check_output_dirs

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1
EXIT_INTERRUPTED = 130  # as a shell reports Ctrl-C
AUTO_KEYS = ("model.name", "data.image_size", "batch_size", "iterations")


@functools.cache
def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def register_resolvers() -> None:
    """`${hw:GPU_VALUE,CPU_VALUE}`: the user's experiment on GPUs, a CPU-sized workload otherwise."""
    if not OmegaConf.has_resolver("hw"):
        OmegaConf.register_new_resolver("hw", lambda gpu, cpu: gpu if has_gpu() else cpu)


def precheck(argv: list[str]) -> None:
    """Unknown group choices and occupied output folders, refused in one line before Hydra starts."""
    try:
        overrides = [a for a in argv if not a.startswith("-")]
        check_group_choices(overrides)
        check_output_dirs(overrides)
    except ConfigError as error:
        _refuse(error)


def _refuse(error: Exception) -> None:
    print(f"error: {error}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_INPUT)


def started_by_torchrun() -> bool:
    from harness.torchrun import started_by_torchrun as check

    return check()


def torchrun_worker(argv: list[str]) -> int:
    from harness.torchrun import run_worker

    try:
        return run_worker([a for a in argv if not a.startswith("-")])
    except ConfigError as error:
        if os.environ.get("RANK") == "0":
            print(f"error: {error}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT


def cpu_defaults_note(cfg: DictConfig) -> str | None:
    if has_gpu():
        return None
    auto = [f"{key}={OmegaConf.select(cfg, key)}" for key in AUTO_KEYS if _is_interpolation(cfg, key)]
    if not auto:
        return None
    return ("No GPU found: CPU-sized defaults " + ", ".join(auto) +
            " (the GPU defaults are resnet101, 224 px, batch 128, 100 iterations); any explicit override wins.")


def _is_interpolation(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return node is not None and leaf in node and OmegaConf.is_interpolation(node, leaf)


def task(cfg: DictConfig) -> dict[str, Any] | None:
    """One Hydra job = one run. Never raises for a run that failed: a sweep must go on."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from harness.runner import Unavailable, execute

    hydra_cfg = HydraConfig.get()
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    run_dir = Path(hydra_cfg.runtime.output_dir)
    note = cpu_defaults_note(cfg)
    if note:
        print(note, flush=True)
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    overrides = list(hydra_cfg.overrides.task)
    repeat = int(cfg_dict.get("repeat", 1))
    all_results = []
    try:
        for index in range(repeat):
            folder = run_dir if repeat == 1 else run_dir / f"repeat-{index}"
            all_results.append(execute(cfg_dict, folder, in_sweep=in_sweep, overrides=overrides))
    except (ConfigError, Unavailable) as error:
        if in_sweep:
            return _record_refused(cfg_dict, run_dir, overrides, error)
        _remove_if_empty_run(run_dir)
        _refuse(error)
    except KeyboardInterrupt:
        print("interrupted: partial results written with status 'interrupted'", file=sys.stderr, flush=True)
        if in_sweep:  # the sweep stops here and Hydra skips on_multirun_end: report what finished now
            from harness.report import build_report

            sweep_dir = Path(hydra_cfg.sweep.dir)
            print(f"writing the report of the finished runs in {sweep_dir}", flush=True)
            build_report([sweep_dir], sweep_dir, cfg_dict.get("report", {}).get("baseline"))
        sys.exit(EXIT_INTERRUPTED)
    if not in_sweep and any(r["status"] not in ("ok", "skipped") for r in all_results):
        sys.exit(EXIT_RUN_FAILED)
    return all_results[-1]


def _record_refused(cfg_dict: dict[str, Any], run_dir: Path, overrides: list[str], error: Exception) -> dict[str, Any]:
    """In a sweep a combination that cannot run is a row with its reason, not the end of the sweep."""
    from harness.results import SCHEMA, write_results
    from harness.runner import Unavailable

    status = "skipped" if isinstance(error, Unavailable | Incompatible) else "failed"
    results = {"schema": SCHEMA, "status": status, "error": str(error),
               "strategy": cfg_dict["strategy"]["name"], "amp": cfg_dict["amp"]["level"],
               "model": cfg_dict["model"]["name"], "devices": [], "world_size": None, "nodes": 1,
               "global_batch": cfg_dict["batch_size"], "iterations": cfg_dict["iterations"],
               "log_every": cfg_dict["log_every"], "windows": [], "per_rank_windows": {},
               "throughput_img_s": None, "memory": {"source": None, "per_device": [], "per_process": []},
               "overrides": overrides, "config": cfg_dict}
    write_results(run_dir, results)
    print(f"[{results['strategy']} {results['amp']}] {status}: {error}", flush=True)
    return results


def _remove_if_empty_run(run_dir: Path) -> None:
    """Hydra made this folder for a run refused before starting: leave no empty run behind."""
    leftovers = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
    if leftovers <= {".hydra", "run.log"} and not (run_dir / "results.json").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
