"""Collective-communication benchmark: how fast do the devices talk, op by op and size by size?

    python -m harness.collectives [nprocs=2] [gpus=[0,1]] [collectives.sizes=[4KiB,1MiB]] [collectives.ops=[all_reduce]]

Composes conf/collectives.yaml with Hydra, places one worker per device exactly as DDP runs are placed
(gloo on CPU, NCCL on GPUs) and starts them with the harness's elastic launcher. Each worker times
all_reduce, broadcast, reduce, all_gather, reduce_scatter, gather, scatter and a ring send/recv over
the message sizes, and the results land in runs/collectives/<timestamp>/: collectives.json (everything,
raw timings included), collectives.md and collectives.csv (the table) and bandwidth.png.

One job per module: `arithmetic` (nccl-tests' bandwidth factors and sizes, pure), `config` (the typed
`collectives.*` section and the placement), `worker` (the rank side), `writers` (md, csv, png),
`runner` (the parent: place, launch, tabulate, collectives.json), `__main__` (the Hydra entry point).
Nothing here imports the training command line (harness.cli).
"""

from harness.collectives.arithmetic import (
    CHUNKED,
    DTYPES,
    GB,
    OPS,
    algbw,
    bus_factor,
    busbw,
    element_count,
    format_size,
    parse_size,
    size_ladder,
    table_row,
    table_rows,
)
from harness.collectives.config import CollectivesConfig, placement_for
from harness.collectives.runner import RESULTS_NAME, run_benchmark
from harness.collectives.worker import Agreement, collective_call, collectives_rank, measure
from harness.collectives.writers import COLUMNS, to_markdown, write_csv, write_plot

__all__ = ["CHUNKED", "COLUMNS", "DTYPES", "GB", "OPS", "RESULTS_NAME", "Agreement", "CollectivesConfig", "algbw",
           "bus_factor", "busbw", "collective_call", "collectives_rank", "element_count", "format_size", "measure",
           "parse_size", "placement_for", "run_benchmark", "size_ladder", "table_row", "table_rows", "to_markdown",
           "write_csv", "write_plot"]
