"""HSDP: strategy=fsdp with `strategy.replicate=N`, FSDP2 over a 2-D mesh of N replicas of world/N shards. Four gloo
ranks shard within pairs and replicate across them (each holds half the parameters, not a quarter) and train what one
process trains, with gradient accumulation; a replicate that does not divide the ranks is refused before anything
starts; the planner times the shard group's collectives on its own link and the replicas' all-reduce of a gradient
shard on the link between nodes, and divides memory by the shard group."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TINY, describe, leave_at_once, refused_before_start, run_cli, run_config, start_ranks
from hydra.utils import get_class
from test_modern import GLOBAL_BATCH, NoNorm, agreed_port, train_here

from harness.core.devices import Placement
from harness.launch.decide import run_plan as place_run
from harness.launch.placement import Hardware
from harness.memory.footprint import footprint, per_rank
from harness.parity import report as verdicts
from harness.prediction import predict as predict_module
from harness.prediction.hardware import Preset
from harness.prediction.links import Link, collective_seconds
from harness.prediction.predict import MIB, Target, comm_time, predict
from harness.prediction.trace import StepTrace
from harness.report import build_rows, find_results
from strategies.base import RankEnv
from strategies.fsdp import FSDP2

WORLD, REPLICATE = 4, 2
SHARD = WORLD // REPLICATE
# NoNorm's parameters: 4*3*9+4 + 6*4*9+6 + 6*10+10 = 404 fp32 elements, each tensor's first dimension even
WHOLE_ELEMENTS = 404


# ---- four real ranks: the mesh, what each holds, what they train ----

def rank_main(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    placement = Placement("cpu", (), (), WORLD, True, tuple(f"cpu:{r}" for r in range(WORLD)), 1, GLOBAL_BATCH)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(agreed_port(rank, Path(out) / "hsdp.port"))
    strategy = FSDP2(replicate=REPLICATE)
    strategy.setup(RankEnv(rank, rank, WORLD, placement, 60))
    try:
        # grad_accum=2: micro-batches under no_sync, then one reduce-scatter and one all-reduce; SGD with momentum
        # steps the DTensor shards
        model, opt = train_here(strategy, GLOBAL_BATCH // WORLD, rank, 2)
        mesh = strategy.mesh()
        assert mesh is not None
        local = {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
        placements = {n: str(p.placements) for n, p in model.named_parameters()}
        options = {"replicate": REPLICATE}
        theory = per_rank(footprint(model, opt), WORLD, strategy.shards, 1, FSDP2.shard_degree(options, WORLD))
        torch.save({"mesh": (tuple(mesh.shape), mesh.mesh_dim_names), "local": local, "placements": placements,
                    "full": strategy.full_parameters(model), "theory": theory}, Path(out) / f"rank{rank}.pt")
    finally:
        strategy.teardown()
    leave_at_once()


@pytest.mark.slow
def test_four_ranks_shard_within_pairs_replicate_across_and_train_what_one_process_trains(tmp_path):
    """Each rank holds the half of every tensor its place in its pair gives it (under FSDP over all four it would
    hold a quarter); ranks 0 and 2 hold the same half; all four gather the same parameters, one process's on the
    whole batch: HSDP averages over all four ranks, and accumulates under no_sync."""
    start_ranks(rank_main, (str(tmp_path),), WORLD)
    from strategies.single import SingleDevice

    single = SingleDevice()
    single.setup(RankEnv(0, 0, 1, Placement("cpu", (), (), 1, False, ("cpu",), 1, GLOBAL_BATCH), 60))
    reference = single.full_parameters(train_here(single, GLOBAL_BATCH, 0, 1)[0])
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    start = NoNorm().state_dict()
    for rank, got in enumerate(ranks):
        assert got["mesh"] == ((REPLICATE, SHARD), ("replicate", "shard"))
        assert set(got["placements"].values()) == {"(Replicate(), Shard(dim=0))"}
        assert sum(t.numel() for t in got["local"].values()) == WHOLE_ELEMENTS // SHARD  # 202, not 101
        for name, whole in got["full"].items():
            half = torch.chunk(whole, SHARD, dim=0)[rank % SHARD]  # its place in its shard group
            torch.testing.assert_close(got["local"][name], half, rtol=0, atol=0, msg=f"rank {rank} {name}")
            torch.testing.assert_close(whole, ranks[0]["full"][name], rtol=0, atol=0, msg=f"replicas: {name}")
            torch.testing.assert_close(whole, reference[name], rtol=1e-5, atol=1e-6, msg=f"reference: {name}")
            assert not torch.equal(whole, start[name])  # training moved it
        # the memory theory the worker records: half the 1616 bytes of parameters a rank
        assert got["theory"]["params_mib"] * MIB == pytest.approx(WHOLE_ELEMENTS * 4 / SHARD)


# ---- the command line ----

HSDP_RUN = ("strategy=fsdp", f"nprocs={WORLD}", f"strategy.replicate={REPLICATE}")
PARITY_RUN = ("parity=true", *TINY, "model.norm=none", "iterations=20", "log_every=10")


@pytest.mark.slow
def test_a_four_rank_hsdp_run_ends_ok_holds_half_the_parameters_a_rank_and_agrees_with_one_device(tmp_path):
    """`nprocs=4 strategy=fsdp strategy.replicate=2`: predicted (the planner's calibration in a process group of one
    has nothing to replicate), trained, its four replicas bit-identical, the theory half the parameters a rank, and
    the parity report's verdict against `strategy=single`: within float32 rounding."""
    # predicted as a run is by default: the strategy itself calibrated in a process group of one
    proc, results = run_cli(*HSDP_RUN, *PARITY_RUN, "plan.predict=true", "plan.calibration=strategy",
                            tmp_path=tmp_path / "hsdp")
    assert proc.returncode == 0 and results is not None, describe(proc)
    assert results["status"] == "ok" and results["world_size"] == WORLD
    assert results["variant"] == f"replicate={REPLICATE}" and results["strategy_options"]["replicate"] == REPLICATE
    assert results["prediction"] is not None, results["prediction_error"]
    theory = results["memory_theory"]
    assert theory["params_mib"] * MIB == pytest.approx(theory["whole_bytes"]["params"] / SHARD)  # not / 4
    parity = results["parity"]
    assert parity["replicas_agree"] is True and len(parity["digests"]) == WORLD
    proc, single = run_cli("strategy=single", *PARITY_RUN, tmp_path=tmp_path / "single")
    assert proc.returncode == 0 and single is not None, describe(proc)
    rows, _ = build_rows(find_results([tmp_path])[0])
    by = {r.label: r for r in rows}
    hsdp = by[f"fsdp O0 replicate={REPLICATE}"]
    assert (hsdp.parity.verdict, hsdp.parity.reference) == (verdicts.AGREES, "single O0"), hsdp.parity.note


def test_a_replicate_that_does_not_divide_the_ranks_is_refused_before_anything_starts(monkeypatch, capsys):
    lines = refused_before_start(["strategy=fsdp", f"nprocs={WORLD}", "strategy.replicate=3", *TINY], monkeypatch, capsys)
    assert lines == ["error: strategy.replicate=3 is not allowed: a divisor of the 4 ranks (1, 2, 4): HSDP's "
                     "replicas each shard over world/replicate ranks"], lines


def test_the_variant_the_shard_degree_and_the_groups_each_collective_runs_over():
    assert FSDP2.variant({"replicate": 2}) == "replicate=2" and FSDP2.variant({"replicate": 1}) == ""
    assert FSDP2.shard_degree({"replicate": 2}, 8) == 4 and FSDP2.shard_degree({}, 8) == 8
    plain, hybrid = FSDP2.traffic({}), FSDP2.traffic({"replicate": 2})
    assert {c.group for c in plain.collectives} == {"world"} and plain.replicate == 1
    assert [(c.op, c.group) for c in hybrid.collectives] == [
        ("all_gather", "shard"), ("all_gather", "shard"), ("reduce_scatter", "shard"), ("all_reduce", "replicate")]


# ---- the planner ----

# 2 nodes of 2 devices: fast inside a node, ten times slower between nodes
INTRA, INTER = Link(latency_us=2.0, bandwidth_gbps=100.0), Link(latency_us=10.0, bandwidth_gbps=10.0)
TWO_BY_TWO = Preset(name="2x2", accelerator="cuda", devices_per_node=2, nodes=2, device_memory_gib=80.0,
                    peak_tflops={"float32": 10.0}, memory_gbps=1000.0, intra=INTRA, inter=INTER)
# 100 MiB of fp32 parameters and of gradients, no units (one call a collective)
TRACE = StepTrace(peak=330 * MIB, params=100 * MIB, masters=0, grads=80 * MIB, optimizer_state=100 * MIB,
                  activations=50 * MIB, flops=10**9, model_params=100 * MIB, model_grads=100 * MIB,
                  stored_params=100 * MIB, param_count=100 * MIB // 4, matrices=((64, 27), (10, 16)), units=(),
                  tracer="meta")


def test_hsdp_gathers_within_a_node_and_all_reduces_a_gradient_shard_between_nodes():
    """4 ranks, replicate=2: shard groups {0, 1} and {2, 3}, one a node; replicate groups {0, 2} and {1, 3}, across.
    Nothing overlaps (compute 0): every second is exposed. The alpha-beta model (harness/prediction/links.py), n ranks:
    latency x hops + bus factor x bytes / bandwidth.
    - all_gather of the 100 MiB of parameters in the shard group: n = 2 in one node, 1 hop at 2 us, bus factor
      (n-1)/n = 1/2 at 100 GB/s: 2e-6 + 0.5 x 100 MiB / 100e9 (= 526 us)
    - reduce_scatter of the 100 MiB of gradients there: the same
    - all_reduce of a gradient shard, 100 MiB / 2 shards = 50 MiB, in the replicate group: n = 2, one rank a node,
      2 hops (reduce-scatter, all-gather) both between nodes at 10 us, bus factor 2(n-1)/n = 1, at the slower
      bandwidth, the node's 10 GB/s shared by its 2 devices (the other replicate group crosses at the same time):
      2 x 10e-6 + 50 MiB / 5e9 (= 10.5 ms; at the node's whole 10 GB/s, 5.26 ms)
    Over the world instead, the gather would cross nodes (3 hops, two of them between nodes, bus factor 3/4 at
    10 GB/s: 7.9 ms), and the whole 100 MiB of gradients all-reduced between nodes would take twice as long."""
    traffic = FSDP2.traffic({"replicate": 2, "reshard_after_forward": False})
    gather = 2e-6 + 0.5 * 100 * MIB / 100e9
    reduce_scatter = gather
    all_reduce = 2 * 10e-6 + 50 * MIB / 5e9
    assert [c.op for c in traffic.collectives] == ["all_gather", "reduce_scatter", "all_reduce"]
    total, exposed = comm_time(traffic, TRACE, 4, TWO_BY_TWO, compute=0.0)
    assert total == exposed == pytest.approx(gather + reduce_scatter + all_reduce)
    alone = [dataclasses.replace(traffic, collectives=(c,)) for c in traffic.collectives]
    assert [comm_time(t, TRACE, 4, TWO_BY_TWO, 0.0)[0] for t in alone] == pytest.approx(
        [gather, reduce_scatter, all_reduce])
    # plain FSDP on the same 4 ranks: the world's ring over both nodes, as before
    world = FSDP2.traffic({"reshard_after_forward": False})
    by_world = sum(collective_seconds(c.op, 100 * MIB, 2, 2, INTRA, INTER) for c in world.collectives)
    assert comm_time(world, TRACE, 4, TWO_BY_TWO, 0.0)[0] == pytest.approx(by_world)
    assert by_world == pytest.approx(2 * (2e-6 + 2 * 10e-6 + 0.75 * 100 * MIB / 10e9))  # 1 hop in, 2 across


@pytest.mark.parametrize("nodes, per_node", [(8, 8), (2, 4)])
def test_on_larger_presets_the_shard_group_stays_in_a_node(nodes, per_node):
    """replicate = nodes: each shard group is one node's ranks (the all-gather at the intra link alone), the
    replicas one rank a node (every hop of their all-reduce crosses, through 1/per_node of the node's link)."""
    preset = dataclasses.replace(TWO_BY_TWO, devices_per_node=per_node, nodes=nodes)
    n = nodes * per_node
    traffic = FSDP2.traffic({"replicate": nodes, "reshard_after_forward": False})
    gather, _, all_reduce = (comm_time(dataclasses.replace(traffic, collectives=(c,)), TRACE, n, preset, 0.0)[0]
                             for c in traffic.collectives)
    assert gather == pytest.approx(collective_seconds("all_gather", 100 * MIB, per_node, 1, INTRA, INTER))
    assert all_reduce == pytest.approx(2 * (nodes - 1) * 10e-6
                                       + 2 * (nodes - 1) / nodes * 100 * MIB / per_node / (10e9 / per_node))


def test_the_planner_divides_memory_and_the_optimizer_step_by_the_shard_group():
    """FSDP on 4 ranks holds a quarter of the 100 MiB of parameters (25), HSDP with 2 replicas half (50); the
    optimizer step likewise steps a quarter or half of 40 ms."""
    preset = dataclasses.replace(TWO_BY_TWO, devices_per_node=4, nodes=1)

    def predicted(**options: Any) -> Any:
        cfg = run_config("fsdp", nprocs=WORLD, batch_size=24,
                         strategy={"_target_": "strategies.fsdp.FSDP2", **options})
        decided = place_run(cfg, Hardware(visible_gpus=(), cores=8), in_sweep=True)
        return predict(cfg, decided.placement, decided.amp, get_class(cfg.strategy["_target_"]), Target(preset, 1))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(predict_module, "trace_step", lambda *args, **kwargs: TRACE)
        patch.setattr(predict_module, "compute_time", lambda *args: (0.1, 0.04, {}, ()))
        plain, hybrid = predicted(), predicted(replicate=2)
    assert plain.ranks[0].params_mib == pytest.approx(25) and hybrid.ranks[0].params_mib == pytest.approx(50)
    assert hybrid.ranks[0].params_mib == pytest.approx(2 * plain.ranks[0].params_mib)
    assert hybrid.ranks[0].optimizer_mib == pytest.approx(2 * plain.ranks[0].optimizer_mib)
    assert (plain.optimizer_s, hybrid.optimizer_s) == pytest.approx((0.01, 0.02))
