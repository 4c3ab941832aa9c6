"""How right the predictions are for a language model: bench/prediction.py's cases on model=gpt (4 blocks of
width 64, sequences of 128, global batch 16), activation checkpointing off and on.

    python bench/prediction_llm.py [--write-results]

Cases: single, ddp, zero, fsdp and allreduce x O0 and O1 (bfloat16) x model.checkpoint false, true x 1 and 2
processes (single: one); tensor parallelism (strategy=tp, without and with sequence parallelism) and the pipeline
(strategy=pp, 1F1B, 4 microbatches) on 2 processes. Errors, goals and `--fresh N` as bench/prediction.py's.
"""

from __future__ import annotations

import argparse
import sys

import common
from prediction import add_case_args, command_of, run_cases

# the language models of published runs, at their sizes on GPUs this machine does not have, are planned against
# their published figures in benchmark 18
PUBLISHED = ("- Published runs (llm-foundry's MPT 125M-70B on A100 and H100, torchtitan's Llama): each row's source, "
             "prediction, error and plan time in benchmark 18 (benchmarks/published_llm.md)")
GPT = ["model=gpt", "model.layers=4", "model.seq_len=128", "batch_size=16", "model.checkpoint=false,true"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_case_args(parser)
    args = common.parse_args(parser, argv)
    settings, tables, lines = run_cases(args, {"gpt": [*GPT, "iterations=100"]},
                                        {"gpt": ["model=gpt", "iterations=40", "batch_size=8"]},
                                        "single, ddp, zero, fsdp, allreduce x O0, O1 bf16 x gpt with checkpointing "
                                        "off and on x 1 and 2 processes; tp (sequence parallel or not) and pp on 2 "
                                        "processes",
                                        (["strategy=tp,pp", "nprocs=2"],
                                         ["strategy=tp", "strategy.sequence_parallel=true", "nprocs=2"]))
    lines = [*lines, PUBLISHED]
    if args.write_results:
        common.write_results("prediction_llm", common.results_page("prediction_llm", settings, tables, lines,
                                                                   command_of("prediction_llm", args)),
                             args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
