"""Compare parallel training strategies: `python run.py strategy=ddp amp=O2 gpus=[0,1,3]`,
or sweep them side by side with `python run.py -m`. See README.md."""

import os
import sys

os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA numbers GPUs as nvidia-smi/NVML do

from harness.core.stops import (  # noqa: E402
    INTERRUPTED_BEFORE_RUNS,
    INTERRUPTED_BETWEEN_RUNS,
    interrupt_ends_quietly,
)

with interrupt_ends_quietly(INTERRUPTED_BEFORE_RUNS):  # Ctrl-C at any moment: one line, exit 130
    from typing import Any

    import hydra
    from omegaconf import DictConfig

    from harness import cli
    from harness.core.logs import warnings_to_log

    warnings_to_log()  # libraries' warnings into the log files, not between a run's lines
    cli.register_resolvers()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any] | None:
    return cli.task(cfg)  # a sweep's rounds read each run's results from here


if __name__ == "__main__":
    with interrupt_ends_quietly(INTERRUPTED_BEFORE_RUNS):
        if cli.started_by_torchrun():  # one worker of a run torchrun launched: launch nothing
            sys.exit(cli.torchrun_worker(sys.argv[1:]))
        sys.argv[1:] = cli.precheck(sys.argv[1:])  # every run checked; a typed sweep axis sweeps alone
    with interrupt_ends_quietly(INTERRUPTED_BETWEEN_RUNS):  # a run stopped mid-way says so itself (cli.task)
        main()
