"""`python -m harness.collectives [key=value ...]`: Hydra composes conf/collectives.yaml; exit 2 on bad
input (one line), 1 when the benchmark failed. Needs nothing of the training command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from harness.collectives.config import register_defaults
from harness.collectives.runner import remove_if_empty_run, run_benchmark
from harness.compose import register_resolvers
from harness.core.config import CONF_DIR
from harness.core.errors import EXIT_BAD_INPUT, EXIT_RUN_FAILED, ConfigError
from harness.core.logs import refusals


def main() -> None:
    """Compose conf/collectives.yaml with the command line's overrides and run the benchmark once."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    register_resolvers()
    register_defaults()  # conf/collectives.yaml's `collectives_defaults`

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="collectives")
    def task(cfg: DictConfig) -> None:
        cfg_dict = OmegaConf.to_container(cfg, resolve=True)
        out_dir = Path(HydraConfig.get().runtime.output_dir)
        try:
            results = run_benchmark(cfg_dict, out_dir)
        except ConfigError as error:
            remove_if_empty_run(out_dir)
            refusals().error("%s", error)
            sys.exit(EXIT_BAD_INPUT)
        if results["status"] != "ok":
            sys.exit(EXIT_RUN_FAILED)

    task()


if __name__ == "__main__":
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA numbers GPUs as nvidia-smi/NVML do
    main()
