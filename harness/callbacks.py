"""Hydra callback: when a sweep ends, build the side-by-side report in the sweep folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class ReportCallback(Callback):
    def __init__(self, baseline: str | None = None) -> None:
        self.baseline = baseline

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from harness.report import build_report

        sweep_dir = Path(config.hydra.sweep.dir)
        if sweep_dir.is_dir():
            build_report([sweep_dir], sweep_dir, self.baseline)
