"""Tensor parallelism: `strategy=tp` (Megatron-style, the model's own `tp_plan()`, over every rank) and FSDP x TP
(`strategy=fsdp strategy.tp=N`, a (dp, tp) mesh). Real gloo runs on model=gpt end ok, hold the blocks' weights split
a rank, and train what one process trains (parity at O0); what cannot run is refused in one line before anything
starts; the activations' collectives are declared and sized by hand."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import describe, refused_before_start, run_cli, run_sweep

from harness.core.traffic import Collective, activation_bytes
from harness.parity import report as verdicts
from harness.prediction.hardware import Preset
from harness.prediction.links import Link, collective_seconds
from harness.prediction.predict import BlockActivations, comm_time
from harness.prediction.trace import StepTrace
from harness.rank.gpt import GPT
from harness.report import build_rows, find_results
from strategies.fsdp import FSDP2
from strategies.tp import TensorParallel, interleaved

# layers=2, width=32, heads=2, vocab_size=64, seq_len=16 (GPT-2 shape), as tests/test_gpt.py counts it: 30080 fp32
# parameters, 120320 bytes, whole. Under TP over 2 ranks each rank holds, per block: the norms 128 whole; qkv
# (32*96 + 96) / 2 = 1584; out 32*32/2 + 32 (a row-wise split keeps the bias whole) = 544; up (32*128 + 128) / 2 =
# 2112; down 128*32/2 + 32 = 2080: 6448, two blocks 12896; the head split by vocabulary 64*32/2 = 1024; and whole
# the embeddings 2048 + 512 and final norm 64 = 2624. Together 16544 fp32 = 66176 bytes a rank. FSDP x TP (2 x 2)
# shards that again over 2: 33088.
GPT_RUN = ("model=gpt", "model.layers=2", "model.width=32", "model.heads=2", "model.vocab_size=64",
           "model.seq_len=16", "batch_size=8", "iterations=20", "log_every=10", "parity=true")
WHOLE_BYTES, TP_BYTES = 30080 * 4, 16544 * 4
MIB = 2**20


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`strategy=single` on the GPT-2 shape, what parity compares each tensor-parallel run with (the Llama shape's
    section-by-section split is checked in-process below), and `strategy=tp` on two ranks, predicted: one sweep (one
    interpreter and fork server). Strategy -> its job folder."""
    sweep = tmp_path_factory.mktemp("tp") / "sweep"
    proc = run_sweep("strategy=single,tp", "nprocs=2", *GPT_RUN, "plan.predict=true", sweep_dir=sweep)
    assert proc.returncode == 0, describe(proc)
    return {json.loads(p.read_text())["strategy"]: p.parent for p in sweep.glob("*/results.json")}


def _verdict(single: Path, run: Path, label: str) -> Any:
    rows, _ = build_rows(find_results([single, run])[0])
    labels = {r.label: r for r in rows}
    assert label in labels, sorted(labels)
    return labels[label].parity


@pytest.mark.xdist_group("tp")  # one worker starts the module's runs (each worker would start them)
@pytest.mark.slow
def test_two_rank_tp_ends_ok_holds_the_blocks_split_and_agrees_with_one_device(two_ranks):
    results = json.loads((two_ranks["tp"] / "results.json").read_text())
    assert results["status"] == "ok" and results["world_size"] == 2
    assert results["prediction"] is not None, results["prediction_error"]  # calibrated in a process group of one
    held = [rank["params_held_mib"] * MIB for rank in results["ranks"]]
    assert held == [TP_BYTES, TP_BYTES], held  # not WHOLE_BYTES: the blocks' Linears are DTensor halves
    assert results["parity"]["replicas_agree"] is True
    parity = _verdict(two_ranks["single"], two_ranks["tp"], "tp O0")
    assert (parity.verdict, parity.reference) == (verdicts.AGREES, "single O0"), parity.note


@pytest.mark.xdist_group("tp")  # one worker starts the module's runs (each worker would start them)
@pytest.mark.slow
def test_fsdp_by_tp_on_four_ranks_ends_ok_halves_the_tp_slices_again_and_agrees_with_one_device(tmp_path, two_ranks):
    # with sequence parallelism (the plan strategy=tp applies too, here on the 2-D mesh's tp dim): the norms and
    # the residual stream on the sequence's shards, the head gathering them
    proc, results = run_cli("strategy=fsdp", "nprocs=4", "strategy.tp=2", "strategy.sequence_parallel=true",
                            *GPT_RUN, tmp_path=tmp_path)
    assert proc.returncode == 0 and results is not None, describe(proc)
    assert results["status"] == "ok" and results["world_size"] == 4
    assert results["variant"] == "tp=2 sequence_parallel"
    held = [rank["params_held_mib"] * MIB for rank in results["ranks"]]
    assert held == [TP_BYTES / 2] * 4, held
    assert results["parity"]["replicas_agree"] is True
    parity = _verdict(two_ranks["single"], tmp_path, "fsdp O0 sequence_parallel tp=2")
    assert (parity.verdict, parity.reference) == (verdicts.AGREES, "single O0"), parity.note


# ---- refused before anything starts ----

@pytest.mark.parametrize(("overrides", "line"), [
    (("strategy=tp", "nprocs=2", "model=tiny_cnn", "data.image_size=8", "batch_size=8"),
     "error: model=tiny_cnn is not allowed: a model with tp_plan() (docs/workloads.md) with strategy=tp over every "
     "rank: this model declares no plan of which weights to split"),
    (("strategy=tp", "nprocs=2", "model=gpt", "model.width=48", "model.heads=3", "batch_size=8"),
     "error: model.heads=3 is not allowed: a multiple of the 2 tensor-parallel ranks (strategy=tp over every rank): "
     "each rank computes 1/2 of them"),
    (("strategy=fsdp", "nprocs=4", "strategy.tp=3", "model=gpt", "batch_size=8"),
     "error: strategy.tp=3 is not allowed: a divisor of the 4 ranks (1, 2, 4): FSDP shards over world/tp groups of "
     "tp ranks"),
    (("strategy=fsdp", "nprocs=4", "strategy.tp=2", "strategy.replicate=2", "model=gpt", "batch_size=8"),
     "error: strategy.tp=2 is not allowed: 1 with strategy.replicate=2 (HSDP x TP would need a 3-D mesh: not "
     "wired), or strategy.replicate=1 with tp"),
    (("strategy=fsdp", "nprocs=4", "strategy.tp=2", "model=tiny_cnn", "data.image_size=8", "batch_size=8"),
     "error: model=tiny_cnn is not allowed: a model with tp_plan() (docs/workloads.md) with strategy.tp=2: this "
     "model declares no plan of which weights to split"),
])
def test_what_tensor_parallelism_cannot_run_is_refused_in_one_line_before_anything_starts(overrides, line,
                                                                                           monkeypatch, capsys):
    lines = refused_before_start(overrides, monkeypatch, capsys)
    assert lines == [line], lines


def test_apex_and_the_levels_tp_does_not_run_are_refused_with_the_reason():
    from harness.core.amp_levels import AmpConfig, resolve
    from harness.core.errors import Incompatible

    for level, impl, dtype, key in (("O1", "apex", "float16", "amp.impl"), ("O2", "native", "bfloat16", "amp.level"),
                                    ("O1", "native", "float16", "amp.loss_scale")):
        with pytest.raises(Incompatible) as info:
            TensorParallel.check_compatible(None, resolve(AmpConfig(level=level, impl=impl, dtype=dtype), "cuda"))
        assert info.value.key == key
    TensorParallel.check_compatible(None, resolve(AmpConfig(level="O1", dtype="bfloat16"), "cuda"))  # runs


def test_fsdp_by_tp_runs_o2_by_fsdps_policy_and_refuses_the_model_casts(monkeypatch, capsys):
    """FSDP x TP at O2 casts through FSDP2's MixedPrecisionPolicy (torchtitan's bf16), which reaches the TP slices;
    O3 and O2 without masters cast the model itself: refused in one line."""
    from harness.core.amp_levels import AmpConfig, resolve
    from strategies.fsdp import FSDP_TP_AMP_RULES

    o2 = resolve(AmpConfig(level="O2", dtype="bfloat16"), "cuda")
    assert not any(rule.matches(o2) for rule in FSDP_TP_AMP_RULES)
    base = ("strategy=fsdp", "nprocs=4", "strategy.tp=2", "model=gpt", "batch_size=8", "amp.dtype=bfloat16")
    assert refused_before_start((*base, "amp=O3"), monkeypatch, capsys) == [
        "error: amp.level=O3 is not allowed: O0, O1 or O2 with strategy.tp (O3 casts the model itself before TP "
        "slices it: not verified yet; O2's policy casts the gathered slices instead)"]
    assert refused_before_start((*base, "amp=O2", "amp.master_weights=false"), monkeypatch, capsys) == [
        "error: amp.master_weights=false is not allowed: true with strategy.tp at O2 (without masters the model "
        "itself is cast, as O3: not verified yet)"]


# ---- what it declares ----

def test_the_activations_collectives_per_block_sized_by_hand():
    """model=gpt as above, 8 sequences of 16 tokens a rank's micro-batch, width 32, fp32, 2 blocks: without sequence
    parallelism two all-reduces a block each way, each of the block's whole activations 8 x 16 x 32 x 4 = 16 KiB, so
    2 x 2 x 16384 = 65536 bytes forward and as many backward; with it an all-gather and a reduce-scatter of the same
    size in their place forward, an all-gather and an all-reduce backward (as DTensor issues them: below). A
    checkpointed block recomputes the forward's first all-reduce, not its last; with sequence parallelism both
    all-gathers and the first reduce-scatter."""
    plain = TensorParallel.traffic({})
    assert plain.predictable and plain.tensor_parallel_over(4) == 4  # strategy=tp: every rank
    assert [(c.op, c.payload, c.group, c.calls, c.count, c.every) for c in plain.collectives] == \
        [("all_reduce", "activations", "tp", "per_block", 2, "micro_batch")] * 2
    assert [activation_bytes(c, 8 * 16, 32, 4, 2) for c in plain.collectives] == [65536, 65536]
    sequence = TensorParallel.traffic({"sequence_parallel": True})
    assert [(c.op, c.payload) for c in sequence.collectives] == [
        ("all_gather", "activations"), ("reduce_scatter", "activations"), ("all_gather", "activations"),
        ("all_reduce", "activations"), ("all_reduce", "whole_grads")]  # the last: the norms' gradients, in the step
    per_block = sequence.collectives[:4]
    assert [c.recomputed for c in plain.collectives] == [1, 0]
    assert [c.recomputed for c in per_block] == [2, 1, 0, 0]
    with pytest.raises(ValueError, match="recomputed"):
        Collective("all_reduce", "activations", "none", calls="per_block", count=2, recomputed=3)
    assert sum(activation_bytes(c, 8 * 16, 32, 4, 2) for c in per_block) == 4 * 65536
    with pytest.raises(ValueError, match="per block"):
        Collective("all_reduce", "activations", "none")
    both = FSDP2.traffic({"tp": 2})
    assert both.tensor_parallel_over(4) == 2 and both.sharded_over(4) == 4
    assert [(c.op, c.group) for c in both.collectives] == [
        ("all_gather", "dp"), ("all_gather", "dp"), ("reduce_scatter", "dp"), ("all_reduce", "tp"), ("all_reduce", "tp")]
    assert FSDP2.variant({"tp": 2}) == "tp=2" and TensorParallel.variant({"sequence_parallel": True})


def test_the_plan_splits_fused_projections_section_by_section_and_one_device_is_unchanged():
    """Rows of q|k|v (8 | 4 | 4) over 2 ranks: rank 0 gets q's first half, k's and v's, rank 1 the rest; the model's
    sizes each rank must divide; a single device reads its full head count off the projection."""
    assert interleaved((8, 4, 4), 2).tolist() == [0, 1, 2, 3, 8, 9, 12, 13, 4, 5, 6, 7, 10, 11, 14, 15]
    model = GPT(layers=1, width=16, heads=4, kv_heads=2, shape="llama", vocab_size=32, seq_len=8)
    plan = model.tp_plan(False)
    assert set(plan) == {"blocks.0.attention.qkv", "blocks.0.attention.out", "blocks.0.mlp.up", "blocks.0.mlp.down",
                         "head"}  # the head by vocabulary: its loss on the shards (loss_parallel)
    assert plan["blocks.0.attention.qkv"].sections == (16, 8, 8)  # type: ignore[attr-defined]
    assert {"blocks.0.attention_norm", "blocks.0.mlp_norm", "blocks.0", "norm", "head"} <= set(model.tp_plan(True))
    assert GPT.tp_sizes({"heads": 4, "kv_heads": 2}, True) == {"model.heads": 4, "model.kv_heads": 2,
                                                                "model.seq_len": 64, "model.vocab_size": 256}
    # a tied head (the embedding's weight) or the fused loss (whole rows) keeps the logits whole
    assert "head" not in GPT(layers=1, width=16, heads=4, vocab_size=32, seq_len=8, tie_embeddings=True).tp_plan(False)
    assert "head" not in GPT(layers=1, width=16, heads=4, vocab_size=32, seq_len=8, loss_chunks=2).tp_plan(False)
    assert "model.vocab_size" not in GPT.tp_sizes({"heads": 4, "loss_chunks": 2}, False)
    torch.manual_seed(0)
    assert model(torch.randint(0, 32, (2, 8))).shape == (2, 8, 32)


# ---- the planner ----

# 2 nodes of 2 devices: fast inside a node, ten times slower between nodes (as tests/test_hsdp.py)
INTRA, INTER = Link(latency_us=2.0, bandwidth_gbps=100.0), Link(latency_us=10.0, bandwidth_gbps=10.0)
TWO_BY_TWO = Preset(name="2x2", accelerator="cuda", devices_per_node=2, nodes=2, device_memory_gib=80.0,
                    peak_tflops={"float32": 10.0}, memory_gbps=1000.0, intra=INTRA, inter=INTER)
PARAMS = 100 * MIB
TRACE = StepTrace(peak=330 * MIB, params=PARAMS, masters=0, grads=PARAMS, optimizer_state=PARAMS,
                  activations=50 * MIB, flops=10**9, model_params=PARAMS, model_grads=PARAMS, stored_params=PARAMS,
                  param_count=PARAMS // 4, matrices=((64, 27), (10, 16)), units=(), tracer="meta")
# one block's activations: 8 sequences of 1024 tokens of width 4096 in fp32 = 128 MiB; 4 blocks
BLOCK = BlockActivations(8 * 1024 * 4096 * 4, 4, "float32")


def test_the_planner_prices_tp_all_reduces_per_block_on_their_group_and_fsdp_across_the_groups():
    """Nothing hides (waited for). strategy=tp over all 4 ranks: 2 all-reduces a block forward and 2 backward, 16
    calls of 128 MiB over both nodes, each 6 hops (4 of them crossing: 2 x 2 us + 4 x 10 us) plus 2(n-1)/n = 3/2 x
    128 MiB at the slower 10 GB/s. FSDP x TP on 2 x 2: the TP group is a node's 2 ranks (2 hops at 2 us, bus factor 1
    at 100 GB/s); FSDP's all-gather of each rank's TP half of the 100 MiB of parameters (50 MiB) and its
    reduce-scatter run across the nodes, one rank of each (1 hop at 10 us, bus factor 1/2, through its half of the
    node's 10 GB/s: the other data-parallel group crosses at the same time, links.node_share)."""
    world_call = 2 * 2e-6 + 4 * 10e-6 + 1.5 * 128 * MIB / 10e9
    assert world_call == pytest.approx(collective_seconds("all_reduce", 128 * MIB, 2, 2, INTRA, INTER))
    total, exposed = comm_time(TensorParallel.traffic({}), TRACE, 4, TWO_BY_TWO, compute=1.0, activations=BLOCK)
    assert total == exposed == pytest.approx(16 * world_call)
    node_call = 2 * 2e-6 + 128 * MIB / 100e9
    dp_call = 10e-6 + 0.5 * 50 * MIB / 5e9
    both = FSDP2.traffic({"tp": 2, "reshard_after_forward": False})
    total, exposed = comm_time(both, TRACE, 4, TWO_BY_TWO, compute=0.0, activations=BLOCK)
    assert total == exposed == pytest.approx(16 * node_call + 2 * dp_call)


def test_sequence_parallelisms_whole_parameters_are_all_reduced_once_a_step_one_call_each():
    """With sequence parallelism a block's 2 all-gathers and 2 reduce-scatters forward, 2 all-gathers and 2
    all-reduces backward (each 128 MiB, 4 blocks: 32 calls, every micro-batch; outside them the final norm's output
    and the embeddings' gradient gathered: 2 more), and the norms' 9 whole parameters of
    4096 float32 (16 KiB) all-reduced once a step, one call each, over the TP group. On 2 x 2 with TP over a node's 2
    ranks (FSDP x TP's, its FSDP traffic left out; nothing hides) and 2 micro-batches: 2 x 34 activation calls and
    9 whole ones, not 18 (they are reduced in the step, not every micro-batch) and not 0 (left out)."""
    block = replace(BLOCK, whole=(4096,) * 9)
    traffic = FSDP2.traffic({"tp": 2, "sequence_parallel": True, "reshard_after_forward": False})
    tp_only = replace(traffic, collectives=tuple(c for c in traffic.collectives if c.group == "tp"))
    assert [c.payload for c in tp_only.collectives].count("whole_grads") == 1
    call = functools.partial(collective_seconds, devices_per_node=2, nodes=1, intra=INTRA, inter=INTER)
    activation_ops = ["all_gather"] * 4 + ["reduce_scatter"] * 2 + ["all_reduce"] * 2
    per_micro_batch = 4 * sum(call(op, 128 * MIB) for op in activation_ops) + 2 * call("all_gather", 128 * MIB)
    whole = 9 * call("all_reduce", 16 * 1024)
    assert whole == pytest.approx(9 * (2 * 2e-6 + 16 * 1024 / 100e9))
    total, exposed = comm_time(tp_only, TRACE, 4, TWO_BY_TWO, compute=0.0, micro_batches=2, activations=block)
    assert total == exposed == pytest.approx(2 * per_micro_batch + whole)


# one rank of a TP group of 2 in torch's fake process group: model=gpt's collectives in a forward, backward and
# optimizer step, counted by DTensor's CommDebugMode, for each pairing of sequence parallelism, checkpointing and the
# head, and the Llama shape
COUNT_COLLECTIVES = """
import contextlib, json, sys
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from harness.prediction.calibrate import fake_process_group
from harness.rank.checkpointing import checkpoint_blocks
from harness.rank.gpt import GPT
from strategies.tp import parallelize

fake_process_group(2)
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
counted = []
for sequence, mode, tie, shape in json.loads(sys.argv[1]):
    torch.manual_seed(0)
    model = checkpoint_blocks(GPT(layers=2, width=32, heads=4, vocab_size=64, seq_len=16, tie_embeddings=tie,
                                  shape=shape), mode, "harness.rank.gpt.GPT")
    with contextlib.ExitStack() as held:
        model = parallelize(model, mesh, sequence, held)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        tokens = torch.randint(0, 64, (4, 16))
        with CommDebugMode() as comm:
            model.loss(model(tokens), tokens).backward()
            optimizer.step()
    counted.append({str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()})
print(json.dumps(counted))
"""
TORCH_NAMES = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor",
               "reduce_scatter": "reduce_scatter_tensor"}


@pytest.mark.slow
def test_the_planners_tp_collectives_are_those_dtensor_issues():
    """What the planner prices for strategy=tp (the strategy's per-block declarations, with their recomputation under
    checkpointing, and outside_blocks_calls: the head's and the embeddings'), call by call and kind by kind, against
    the collectives torch issues on a 2-block model=gpt in a forward, backward and optimizer step (a subprocess in a
    fake process group). Without sequence parallelism 4 a block and 4 outside (the head's input gradient and
    loss_parallel's 3) = 12, 14 checkpointed (the block's last all-reduce is not recomputed); 8 with a tied head.
    With it, the whole parameters' all-reduces in the step: GPT-2's 2 norms a block and the final one, weight and
    bias, 10 of 32 elements; the Llama shape's RMSNorms have weights only, 5. Counting every forward collective
    again under checkpointing, leaving the head out, or the whole parameters, fails."""
    import json
    import subprocess
    import sys

    from harness.prediction.predict import activation_calls, outside_blocks_calls

    cases = [(sequence, mode, tie, "gpt2") for sequence in (False, True) for mode in ("none", "full", "selective")
             for tie in (False, True)] + [(True, "none", False, "llama"), (True, "full", True, "llama")]
    # the norms' parameters: 2 a block and the final one's, which a tied head leaves whole (it reads all the
    # sequence): not sequence-parallel
    whole = {("gpt2", False): (32,) * 10, ("gpt2", True): (32,) * 8, ("llama", False): (32,) * 5,
             ("llama", True): (32,) * 4}
    done = subprocess.run([sys.executable, "-c", COUNT_COLLECTIVES, json.dumps(cases)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).parents[1], check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    for (sequence, mode, tie, shape), torch_counts in zip(cases, json.loads(done.stdout), strict=True):
        block = BlockActivations(4 * 16 * 32 * 4, 2, "float32", recomputing=mode != "none", vocab_parallel=not tie,
                                 tokens=4 * 16, whole=whole[shape, tie] if sequence else ())
        planned: dict[str, int] = {}
        for collective in TensorParallel.traffic({"sequence_parallel": sequence}).collectives:
            name = TORCH_NAMES[collective.op]
            planned[name] = planned.get(name, 0) + len(activation_calls(collective, block)[0])
        for op, _, _ in outside_blocks_calls(block, sequence):
            planned[TORCH_NAMES[op]] = planned.get(TORCH_NAMES[op], 0) + 1
        assert planned == torch_counts, (sequence, mode, tie, shape)
    assert json.loads(done.stdout)[:4] == [{"all_reduce": 12}, {"all_reduce": 8}, {"all_reduce": 14},
                                           {"all_reduce": 10}]


# one rank of a TP group of 2 in torch's fake process group, under autocast (O1, bfloat16): each collective's op and
# the dtype it carries, in a forward and backward, seen where DTensor dispatches it
DTYPES_OF_COLLECTIVES = """
import collections, contextlib, json, sys
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.utils._python_dispatch import TorchDispatchMode
from harness.prediction.calibrate import fake_process_group
from harness.rank.gpt import GPT
from strategies.tp import parallelize

NAMES = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}
fake_process_group(2)
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
out = []
for sequence, tie in json.loads(sys.argv[1]):
    seen = collections.Counter()

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if name.startswith("_c10d_functional.") and name.split(".")[1] in NAMES:
                seen[NAMES[name.split(".")[1]] + ":" + str(args[0].dtype).removeprefix("torch.")] += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = GPT(layers=2, width=32, heads=4, vocab_size=64, seq_len=16, tie_embeddings=tie)
    with contextlib.ExitStack() as held:
        model = parallelize(model, mesh, sequence, held)
        tokens = torch.randint(0, 64, (4, 16))
        with Seen():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model.loss(model(tokens), tokens)
            loss.backward()
    out.append(dict(seen))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_at_o1_the_planner_prices_each_tp_collective_in_the_dtype_it_carries():
    """Under autocast the projections' outputs (and their gradients) are bfloat16, but the residual stream stays
    float32: the norms' outputs that sequence parallelism gathers and every block input's gradient that backward
    reduces (the head's too). Without sequence parallelism a 2-block GPT's forward all-reduces 4 bfloat16 tensors
    and its backward 4 float32 ones, and 1 more for the head's input where the head is split; with it 4 float32
    all-gathers forward and 2 outside the blocks, 4 bfloat16 reduce-scatters, 4 bfloat16 all-gathers and 4 float32
    all-reduces backward, and the head's float32 reduce-scatter. Pricing every call in bfloat16 (as before:
    benchmark 15's tensor parallelism at O1 was predicted 12-17 % slow, gloo reducing bfloat16 far slower than
    float32) or every call in float32 fails. loss_parallel's per-token float32 reductions are counted by the test
    above, and are not seen here."""
    import json
    import subprocess
    import sys

    from harness.prediction.predict import activation_calls, outside_blocks_calls

    cases = [(sequence, tie) for sequence in (False, True) for tie in (False, True)]
    done = subprocess.run([sys.executable, "-c", DTYPES_OF_COLLECTIVES, json.dumps(cases)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).parents[1], check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    for (sequence, tie), seen in zip(cases, json.loads(done.stdout), strict=True):
        block = BlockActivations(4 * 16 * 32 * 2, 2, "bfloat16", vocab_parallel=not tie, tokens=4 * 16,
                                 residual_dtype="float32")
        planned: dict[str, int] = {}
        for collective in TensorParallel.traffic({"sequence_parallel": sequence}).collectives:
            if collective.payload == "activations":  # the whole parameters' all-reduces come in the optimizer's step
                calls, dtype = activation_calls(collective, block)
                planned[f"{collective.op}:{dtype}"] = planned.get(f"{collective.op}:{dtype}", 0) + len(calls)
        for op, size, dtype in outside_blocks_calls(block, sequence):
            if size != block.tokens * 4:  # loss_parallel's
                planned[f"{op}:{dtype}"] = planned.get(f"{op}:{dtype}", 0) + 1
        assert planned == seen, (sequence, tie, planned, seen)
    assert json.loads(done.stdout)[0] == {"all_reduce:bfloat16": 4, "all_reduce:float32": 5}


def test_a_ranks_share_of_the_activations_by_the_count_per_block():
    """Korthikanti et al.'s 34 bytes a token and width: at tp=8 without sequence parallelism 10 whole and 24/8,
    (10 + 3) / 34; with it 4 whole (the all-gathered inputs of q|k|v and up, which Linear saves) and 30/8,
    7.75 / 34; full checkpointing keeps the blocks' inputs alone: whole, or split along the sequence. One rank: 1."""
    from harness.core.traffic import tensor_parallel_share

    assert tensor_parallel_share(8, False, "none") == pytest.approx(13 / 34)
    assert tensor_parallel_share(8, True, "selective") == pytest.approx(7.75 / 34)
    assert tensor_parallel_share(2, False, "none") == pytest.approx(22 / 34)  # not 1/2: the norms' inputs stay whole
    assert (tensor_parallel_share(8, False, "full"), tensor_parallel_share(8, True, "full")) == (1.0, 1 / 8)
    assert tensor_parallel_share(1, True, "none") == 1.0


@pytest.mark.parametrize(("overrides", "recomputing", "vocab_parallel"), [
    ((), False, True),  # model=gpt's own head: split by vocabulary
    (("model.checkpoint=full",), True, True),
    (("model.checkpoint=selective", "model.tie_embeddings=true"), True, False),  # the head is the embedding
    (("model.loss_chunks=4",), False, False),  # the fused loss writes its gradient over whole logits
])
def test_block_activations_reads_recomputation_and_the_vocabulary_split_from_the_config(overrides, recomputing,
                                                                                         vocab_parallel):
    """The flags the TP count test builds by hand, as the planner derives them from a composed run: recomputing
    iff model.checkpoint is not none, the head split iff the model's tp_sizes names model.vocab_size; a block's
    bytes micro-batch x sequence x width x 4 (float32 at O0), 2 at O1's bfloat16; tokens micro-batch x sequence."""
    from harness.compose import compose_one, hydra_context
    from harness.core.amp_levels import resolve
    from harness.prediction.predict import block_activations

    with hydra_context():
        cfg = compose_one(["strategy=tp", "nprocs=2", "model=gpt", "model.layers=3", "model.width=32",
                           "model.seq_len=16", *overrides]).run
    found = block_activations(cfg, resolve(cfg.amp, "cpu"), 4)
    assert found == BlockActivations(4 * 16 * 32 * 4, 3, "float32", recomputing=recomputing,
                                     vocab_parallel=vocab_parallel, tokens=4 * 16, residual_dtype="float32")
    half = block_activations(cfg, resolve(replace(cfg.amp, level="O1", dtype="bfloat16"), "cpu"), 4)
    assert (half.bytes, half.dtype) == (4 * 16 * 32 * 2, "bfloat16")
    assert half.of(residual=True) == (4 * 16 * 32 * 4, "float32")  # autocast keeps the residual stream float32
    cast = block_activations(cfg, resolve(replace(cfg.amp, level="O2", dtype="bfloat16"), "cpu"), 4)
    assert cast.of(residual=True) == cast.of(residual=False) == (4 * 16 * 32 * 2, "bfloat16")  # the model cast
    # sequence parallelism's whole parameters, from the model's plan: 3 blocks' 2 LayerNorms, and the final one
    # where the head is split (the sequence's shards reach it), weight and bias of 32 each (none asked: none)
    found = block_activations(cfg, resolve(cfg.amp, "cpu"), 4, sequence_parallel=True)
    assert found.whole == (32,) * (14 if vocab_parallel else 12)
