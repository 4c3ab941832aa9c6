"""Compare parallel training strategies: `python run.py strategy=ddp amp=O2 gpus=[0,1,3]`,
or sweep them side by side with `python run.py -m`. See README.md."""

import os
import sys

os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA numbers GPUs as nvidia-smi/NVML do

from typing import Any  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from harness import cli  # noqa: E402

cli.register_resolvers()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any] | None:
    return cli.task(cfg)  # a sweep's rounds read each run's results from here


if __name__ == "__main__":
    if cli.started_by_torchrun():  # one worker of a run torchrun launched: launch nothing
        sys.exit(cli.torchrun_worker(sys.argv[1:]))
    sys.argv[1:] = cli.precheck(sys.argv[1:])  # every run checked; a typed sweep axis sweeps alone
    main()
