"""harness.launch.published_llm: published language-model runs planned by the planner's own command line; the fast
path a fit uses equals the planner's answer; a true refusal stays; plan.nodes is checked."""

from __future__ import annotations

import pytest

from harness.core.config import check_plan
from harness.core.errors import ConfigError
from harness.launch import published_llm as llm


def _case(**changes: object) -> llm.LlmCase:
    base = dict(model="mpt_125m", gpu="a100x8", gpus=8, seq_len=2048, global_batch=640, micro_batch=40,
                checkpointing="none", precision="bf16", sharding="full_shard", published=142830.0, mfu=0.4479,
                memory_gib=None, source="LLMF", where="A100 80GB")
    return llm.LlmCase(**{**base, **changes})  # type: ignore[arg-type]


def test_a_row_becomes_the_command_a_user_would_type():
    case = _case(gpus=64, global_batch=2048, micro_batch=8, checkpointing="full", sharding="shard_grad_op")
    line = case.overrides()
    assert case.grad_accum == 4  # 2048 sequences over 64 GPUs at 8 a micro-batch
    assert {"model=mpt_125m", "model.checkpoint=full", "strategy=fsdp", "amp=O2", "amp.dtype=bfloat16",
            "batch_size=2048", "grad_accum=4", "plan.hardware=a100x8", "plan.nodes=8",
            "strategy.reshard_after_forward=false", "model.bias=true", "model.positions=learned"} <= set(line)
    assert "model.loss_chunks=8" in line  # 8 x 2048 tokens in chunks of 2048


def test_the_published_table_loads_its_bf16_data_parallel_rows():
    cases = llm.load_cases()
    assert len(cases) > 100
    assert all(c.precision == "bf16" and c.source == "LLMF" and c.gpu in ("a100x8", "h100x8") for c in cases)
    mpt_125m = [c for c in cases if c.model == "mpt_125m" and c.seq_len == 2048 and c.micro_batch == 40]
    assert [c.published for c in mpt_125m] == [142830.0]  # the figure, as the README prints it


def test_a_tensor_parallel_row_plans_fsdp_by_tp_with_the_batch_of_its_data_parallel_groups():
    """torchtitan's Llama 3 8B on 64 H100s at TP 8 (TT-ATP): 8 data-parallel groups of 8 GPUs, each on a local
    batch of 12 sequences, 96 an optimizer step (not 64 x 12); every GPU's tokens/s is the step's 96 x 8192 over 64."""
    cases = llm.load_cases(sources=("TT-ATP",), gpus=("h100-96gbx8",), tensor_parallel=True)
    vanilla = [c for c in cases if c.where.endswith("Vanilla TP")]
    assert [(c.model, c.gpus, c.tp, c.published) for c in vanilla] == [("llama3_70b", 256, 8, 597.3),
                                                                      ("llama3_8b", 64, 8, 4378.0)]
    case = vanilla[1]
    assert (case.data_parallel, case.grad_accum) == (8, 1)
    assert {"strategy=fsdp", "strategy.tp=8", "strategy.sequence_parallel=true", "batch_size=96", "grad_accum=1",
            "plan.nodes=8", "model.loss_chunks=0"} <= set(case.overrides())
    assert llm.tokens_per_gpu(case, {"prediction": {"s_per_iteration": 2.0}}) == pytest.approx(96 * 8192 / 2.0 / 64)
    assert all(c.tp == 1 for c in llm.load_cases(sources=("TT-ATP", "TT-PERF"), gpus=("h100-96gbx8", "a100x8")))


def test_the_fit_s_fast_path_equals_the_planner_s_answer():
    """What a fit evaluates thousands of times (the traces kept, the factors varied) gives the planner's own
    tokens/s for the same run, and MPT-125M at its published micro-batch of 40 is predicted to fit (issue 52:
    it was refused at 79.6 GiB)."""
    case = _case()
    row = llm.predict_case(case)
    assert row["status"] == "predicted" and row["prediction"]["fits"], row.get("reason")
    planned = llm.tokens_per_gpu(case, row)
    assert planned is not None and llm.case_tokens_per_gpu(case) == pytest.approx(planned, rel=1e-9)
    # the planner's rate is per GPU: 640 sequences of 2048 tokens in s_per_iteration, over 8 GPUs
    assert planned == pytest.approx(640 * 2048 / row["prediction"]["s_per_iteration"] / 8)


def test_a_70b_model_with_adamw_on_8_gpus_is_refused():
    """About 16 bytes of model state a parameter (bf16 weights gathered, fp32 masters, AdamW's two moments),
    sharded over 8 GPUs: 65 billion parameters need ~130 GB a GPU before one activation."""
    row = llm.predict_case(_case(model="mpt_70b", global_batch=8, micro_batch=1, checkpointing="full"))
    assert row["status"] == "predicted" and not row["prediction"]["fits"]
    assert "optimizer state" in row["reason"] or "params" in row["reason"]


def test_plan_nodes_is_checked_before_anything_starts():
    assert check_plan({"enabled": True, "hardware": "h100x8", "nodes": 8}).nodes == 8
    with pytest.raises(ConfigError, match="plan.nodes"):
        check_plan({"enabled": True, "hardware": "h100x8", "nodes": -1})
    with pytest.raises(ConfigError, match="plan.nodes"):
        check_plan({"enabled": True, "hardware": "local", "nodes": 4})
