"""Published language-model training runs (harness/prediction/published_llm.csv, its sources in its header and in
harness/prediction/published_llm_notes.md) as the planner's own commands: each row becomes the `python run.py plan=true ...` line a
user would type for it, composed and predicted by the planner (harness.launch.on_preset.predict_on), so that what
is checked is what a user gets: does it fit, how many tokens/s per GPU.

How a row maps: llm-foundry's MPT runs (FSDP FULL_SHARD or SHARD_GRAD_OP, bf16 compute with fp32 gradient
reduction, AdamW, flash-attention's fused cross-entropy) are `strategy=fsdp amp=O2 amp.dtype=bfloat16` (FSDP2
gathers and computes bf16, keeps fp32 sharded masters, reduces fp32), `model.loss_chunks` for the fused loss, the
benchmarks' shape (learned positions and biases: llm-foundry's defaults, published_llm_notes.md), their micro-batch
and global batch (grad_accum = global / (GPUs x micro)), and their activation checkpointing. SHARD_GRAD_OP (ZeRO-2:
parameters kept gathered between forward and backward) is `strategy.reshard_after_forward=false`."""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLE = Path(__file__).parents[1] / "prediction" / "published_llm.csv"
COLUMNS = ("model", "gpu", "gpus", "seq_len", "global_batch", "micro_batch", "checkpointing", "precision", "sharding",
           "tp", "pp", "compile", "published_tokens_s_per_gpu", "published_mfu", "published_memory_gib", "source",
           "where")
# the loss as the runs compute it: flash-attention's fused cross-entropy keeps the logits and one float per row;
# chunks of about 2k tokens hold as little beside them
LOSS_TOKENS_PER_CHUNK = 2048
# MPT's benchmark shape: llm-foundry's defaults, which the benchmark yamls do not change (published_llm_notes.md)
MPT_SHAPE = ("model.bias=true", "model.positions=learned")
MODEL_DIR = Path(__file__).parents[2] / "conf" / "model"  # a row's model: a named size there


@dataclass(frozen=True)
class LlmCase:
    model: str  # a named size of conf/model/
    gpu: str  # a preset of conf/plan/hardware/ (one node of 8)
    gpus: int
    seq_len: int
    global_batch: int
    micro_batch: int
    checkpointing: str  # none | full | selective
    precision: str
    sharding: str
    published: float  # tokens/s per GPU
    mfu: float | None
    memory_gib: float | None
    source: str
    where: str
    compile: bool = False
    tp: int = 1  # tensor-parallel degree: `micro_batch` is then a data-parallel group's, its tp GPUs sharing it

    @property
    def name(self) -> str:
        ckpt = "" if self.checkpointing == "none" else f" ckpt {self.checkpointing}"
        tp = f" tp{self.tp}" if self.tp > 1 else ""
        return (f"{self.model} {self.gpu.removesuffix('x8')} x{self.gpus}{tp} seq {self.seq_len} mb{self.micro_batch}"
                f"{ckpt}")

    @property
    def data_parallel(self) -> int:
        """The data-parallel groups: one a GPU, or one a tensor-parallel group of `tp` GPUs."""
        return self.gpus // self.tp

    @property
    def grad_accum(self) -> int:
        return max(1, self.global_batch // (self.data_parallel * self.micro_batch))

    def overrides(self) -> list[str]:
        """The command line that plans this run."""
        nodes = math.ceil(self.gpus / 8)
        # llm-foundry's fused cross-entropy (flash-attn's); torchtitan's plain one (its loss upcasts the logits)
        chunks = max(1, self.micro_batch * self.seq_len // LOSS_TOKENS_PER_CHUNK) if self.source == "LLMF" else 0
        line = [f"model={self.model}", f"model.seq_len={self.seq_len}", f"model.checkpoint={self.checkpointing}",
                f"model.loss_chunks={chunks}", "strategy=fsdp", "amp=O2", "amp.dtype=bfloat16", "optim=adamw",
                f"batch_size={self.micro_batch * self.grad_accum * self.data_parallel}", f"grad_accum={self.grad_accum}",
                "plan.enabled=true", f"plan.hardware={self.gpu}", "data.pool=1"]
        if nodes > 1:
            line.append(f"plan.nodes={nodes}")
        if self.model.startswith("mpt_"):
            line += list(MPT_SHAPE)
        if self.sharding == "shard_grad_op":
            line.append("strategy.reshard_after_forward=false")
        if self.tp > 1:  # torchtitan's 2-D parallelism: FSDP over the data-parallel groups, TP within a node, its
            # norms sequence-parallel and its head split by vocabulary (torchtitan's apply_tp, loss_parallel)
            line += [f"strategy.tp={self.tp}", "strategy.sequence_parallel=true"]
        return line


def load_cases(path: Path = TABLE, sources: tuple[str, ...] = ("LLMF",), gpus: tuple[str, ...] = ("a100x8", "h100x8"),
               tensor_parallel: bool = False) -> list[LlmCase]:
    """The bf16 rows of `sources` on `gpus` whose model is a named size: data-parallel ones, or with
    `tensor_parallel` those with a TP degree (FSDP x TP); fp8, context- and pipeline-parallel rows are other
    strategies."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(line for line in handle if not line.startswith("#"))
        rows = list(reader)
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ValueError(f"{path}: columns {reader.fieldnames}, expected {list(COLUMNS)}")
    return [LlmCase(r["model"], r["gpu"], int(r["gpus"]), int(r["seq_len"]), int(r["global_batch"]),
                    int(r["micro_batch"]), r["checkpointing"], r["precision"], r["sharding"],
                    float(r["published_tokens_s_per_gpu"]), float(r["published_mfu"]) if r["published_mfu"] else None,
                    float(r["published_memory_gib"]) if r["published_memory_gib"] else None, r["source"], r["where"],
                    r["compile"] == "true", int(r["tp"] or 1))
            for r in rows if r["source"] in sources and r["gpu"] in gpus and r["precision"] == "bf16"
            and (int(r["tp"] or 1) > 1) == tensor_parallel and int(r["pp"] or 1) == 1 and "cp" not in r["sharding"]
            and (MODEL_DIR / f"{r['model']}.yaml").is_file()]


def predict_case(case: LlmCase) -> dict[str, Any]:
    """The planner's row for the case's command line (harness.planning's plan=true, one combination)."""
    from harness.compose import compose_one, hydra_context
    from harness.launch.on_preset import predict_on

    with hydra_context():
        cfg = compose_one(case.overrides()).run
    return predict_on(cfg, case.gpu, 1)


def tokens_per_gpu(case: LlmCase, row: dict[str, Any]) -> float | None:
    """Predicted tokens/s per GPU (None where it would not fit or was not predicted)."""
    prediction = row.get("prediction") or {}
    seconds = prediction.get("s_per_iteration")
    if not seconds:
        return None
    return case.micro_batch * case.grad_accum * case.data_parallel * case.seq_len / seconds / case.gpus




@dataclass(frozen=True)
class Placed:
    """What a case's time is computed from, once: its composed config, amp, preset, ranks and traces."""

    cfg: Any
    amp: Any
    preset: Any
    micro: int
    ranks: int
    traffic: Any
    trace: Any
    optimizer_over: int  # the ranks the optimizer's state is sharded over (1: not sharded)


@functools.cache
def placed(case: LlmCase) -> Placed | None:
    """The case planned once (harness.launch.on_preset.decide_on, harness.prediction.predict): None where it would not
    fit or cannot run."""
    from harness.compose import compose_one, hydra_context
    from harness.launch.on_preset import decide_on
    from harness.prediction.predict import _unit_names, inputs_here, predict
    from harness.prediction.targets import preset_target
    from harness.prediction.trace import trace_step

    with hydra_context():
        cfg = compose_one(case.overrides()).run
    decided = decide_on(cfg, case.gpu, 1)
    if decided.skipped_because():
        return None
    target = preset_target(case.gpu, 1, cfg.plan.nodes)
    prediction = predict(cfg, decided.placement, decided.amp, decided.strategy_cls, target)
    if not prediction.fits:
        return None
    n = decided.device_ranks
    traffic = decided.strategy_cls.traffic(cfg.strategy)
    if traffic.tensor_parallel_over(n) > 1:
        return None  # a rank's slices are timed by the planner itself (predict_case), not here
    micro = cfg.batch_size // n // cfg.grad_accum
    trace = trace_step(cfg.model, inputs_here(cfg), decided.amp, cfg.optim, micro, cfg.grad_accum,
                       _unit_names(decided.strategy_cls, cfg), device="cuda")  # predict's own: from its cache
    return Placed(cfg, decided.amp, target.preset, micro, n, traffic, trace,
                  traffic.sharded_over(n) if decided.strategy_cls.shards[2] else 1)


def case_tokens_per_gpu(case: LlmCase, factors: Any = None) -> float | None:
    """Tokens/s per GPU under `factors` (the shipped ones if None), as harness.prediction.predict times a preset's
    iteration (compute by the GPU model, the sharded optimizer's step, the communication it does not hide): a fit
    tries many factors on the traces made once. tests/test_prediction_published_llm.py checks it against the planner."""
    from harness.prediction.gpu_model import load_factors
    from harness.prediction.predict import comm_time, gpu_compute_time

    setup = placed(case)
    if setup is None:
        return None
    compute, optimizer, _, _ = gpu_compute_time(setup.cfg, setup.amp, setup.preset, setup.micro, setup.ranks,
                                                factors)
    optimizer /= setup.optimizer_over  # a sharded optimizer steps its shard (HSDP's: the shard group's)
    _, exposed = comm_time(setup.traffic, setup.trace, setup.ranks, setup.preset, compute, setup.cfg.grad_accum,
                           (factors or load_factors()).overlap)
    tokens = setup.cfg.batch_size * case.seq_len
    return tokens / (compute + optimizer + exposed) / case.gpus


__all__ = ["LlmCase", "case_tokens_per_gpu", "load_cases", "placed", "predict_case", "tokens_per_gpu"]
