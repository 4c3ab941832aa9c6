"""strategy=pp: the GPT cut at its blocks into one stage per rank (two with interleaved 1F1B), trained by
torch.distributed.pipelining's schedules on two gloo ranks. Each schedule ends ok, each rank holds about half the
parameters, and the run trains what `single` trains (the losses and the gathered parameters within float32
rounding); what cannot be cut or run is refused in one line before anything starts; the bubble by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch.nn.functional as F
from conftest import describe, refused_before_start, run_cli, run_sweep
from torch import nn

from harness.core.traffic import pipeline_bubble
from harness.parity import report as verdicts
from harness.report import build_rows, find_results
from strategies.pp import Pipeline, block_ranges, shared_across_stages, shared_parameters, split_note

# 4 blocks: two a rank, or one a stage for interleaved 1F1B (4 stages on 2 ranks); batch 8 in 4 microbatches of 2
GPT = ("model=gpt", "model.layers=4", "model.width=32", "model.heads=2", "model.vocab_size=64", "model.seq_len=16",
       "batch_size=8")
PARITY = ("parity=true", "iterations=10", "log_every=5")
PP = ("strategy=pp", "nprocs=2")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pp")


@pytest.fixture(scope="module")
def single(runs: Path) -> dict[str, Any]:
    """The reference: the same model and batch on one process."""
    proc, results = run_cli("strategy=single", *GPT, *PARITY, tmp_path=runs / "single")
    assert proc.returncode == 0 and results is not None and results["status"] == "ok", describe(proc)
    return results


@pytest.fixture(scope="module")
def schedules(runs: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Both schedules in one sweep (one interpreter and fork server): schedule -> (its job folder, its results)."""
    sweep = runs / "schedules"
    proc = run_sweep(*PP, "strategy.schedule=1f1b,interleaved_1f1b", *GPT, *PARITY, sweep_dir=sweep)
    assert proc.returncode == 0, describe(proc)
    found = {}
    for path in sorted(sweep.glob("*/results.json")):
        results = json.loads(path.read_text())
        found[results["config"]["strategy"]["schedule"]] = (path.parent, results)
    return found


@pytest.mark.xdist_group("pp")  # one worker starts the module's runs (each worker would start them)
@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved_1f1b"])  # gpipe: under FSDP x PP below
def test_each_schedule_ends_ok_holds_half_the_parameters_a_rank_and_trains_what_one_process_trains(
        schedule: str, runs: Path, single: dict[str, Any], schedules: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    """Two ranks: each holds its stages' parameters (rank 0 the embeddings and half the blocks, rank 1 the rest, the
    final norm and the head: about half each, together exactly single's); every iteration's loss is single's within
    float32 rounding (the last stage's, broadcast: both ranks record it), and the report's parity verdict against
    `single O0` is that it agrees (the parameters gathered from the stages by single's names)."""
    folder, results = schedules[schedule]
    assert results["status"] == "ok" and results["world_size"] == 2
    assert results["variant"] == f"schedule={schedule} microbatches=4"
    held = [rank["params_held_mib"] for rank in results["ranks"]]
    whole = single["ranks"][0]["params_held_mib"]
    assert sum(held) == pytest.approx(whole) and all(0.4 * whole < h < 0.6 * whole for h in held), held
    parity = results["parity"]
    assert parity["replicas_agree"] is True and len(parity["digests"]) == 2
    assert parity["losses"] == pytest.approx(single["parity"]["losses"], rel=1e-5)
    rows, _ = build_rows(find_results([runs / "single", folder])[0])
    row = next(r for r in rows if r.label.startswith("pp O0"))
    assert (row.parity.verdict, row.parity.reference) == (verdicts.AGREES, "single O0"), row.parity.note


@pytest.mark.xdist_group("pp")  # one worker starts the module's runs (each worker would start them)
@pytest.mark.slow
def test_fsdp_by_pp_on_four_ranks_shards_each_stage_over_two_pipelines_and_trains_what_one_process_trains(
        runs: Path, single: dict[str, Any]) -> None:
    """strategy=fsdp strategy.pp=2 on 4 ranks, GPipe: a (pp, dp) mesh of 2 x 2, ranks 0 and 1 the first stage of
    pipelines 0 and 1 (the embeddings, 2048 + 512 parameters, and blocks 0 and 1, 2 x 12704: tests/test_tp.py
    counts a block), ranks 2 and 3 the last (blocks 2 and 3, the final norm 64 and the head 2048), each stage's
    parameters halved by FSDP2 over the two pipelines: 27968 / 2 = 13984 and 27520 / 2 = 13760 fp32 a rank. Each pipeline trains its half of the batch; the
    loss is their mean and the update FSDP's average: single's within float32 rounding."""
    proc, results = run_cli("strategy=fsdp", "nprocs=4", "strategy.pp=2", "strategy.schedule=gpipe", *GPT, *PARITY,
                            tmp_path=runs / "fsdp_pp")
    assert proc.returncode == 0 and results is not None, describe(proc)
    assert results["status"] == "ok" and results["variant"] == "pp=2 schedule=gpipe microbatches=4"
    held = [rank["params_held_mib"] * 2**20 for rank in results["ranks"]]
    assert held == [13984 * 4, 13984 * 4, 13760 * 4, 13760 * 4], held
    assert sum(held) == pytest.approx(single["ranks"][0]["params_held_mib"] * 2**20)  # each stage once, in halves
    assert results["parity"]["losses"] == pytest.approx(single["parity"]["losses"], rel=1e-5)
    rows, _ = build_rows(find_results([runs / "single", runs / "fsdp_pp"])[0])
    row = next(r for r in rows if r.label.startswith("fsdp O0"))
    assert (row.parity.verdict, row.parity.reference) == (verdicts.AGREES, "single O0"), row.parity.note


# ---- refused before anything starts ----

@pytest.mark.parametrize("overrides, line", [
    ((*PP, *GPT, "model.checkpoint=full"),
     "error: model.checkpoint=full is not allowed: none with strategy=pp: the pipeline's trace (torch.export, under "
     "torch.distributed.pipelining.pipeline) inlines the blocks' checkpointing, so the stages would keep every "
     "activation anyway"),
    (("strategy=fsdp", "nprocs=4", "strategy.pp=3", *GPT),
     "error: strategy.pp=3 is not allowed: a divisor of the 4 ranks (1, 2, 4): FSDP shards each of the pp stages "
     "over world/pp ranks"),
    (("strategy=fsdp", "nprocs=4", "strategy.pp=2", "strategy.tp=2", *GPT),
     "error: strategy.pp=2 is not allowed: 1 with strategy.tp=2 (a pipeline of tensor-parallel stages: not wired), "
     "or strategy.tp=1 with pp"),
    (("strategy=fsdp", "nprocs=2", "strategy.microbatches=8", *GPT),
     "error: strategy.microbatches=8 is not allowed: 4 with strategy.pp=1 (the pipeline's schedule applies with "
     "strategy.pp=N > 1; strategy=pp is a pipeline alone)"),
    (("strategy=fsdp", "nprocs=4", "strategy.pp=2", "amp=O2", "amp.dtype=bfloat16", *GPT),
     "error: amp.level=O2 is not allowed: O0 or O1 with strategy.pp (a pipeline of FSDP2 stages at O2/O3 is not "
     "verified yet)"),
    (("strategy=fsdp", "nprocs=4", "strategy.pp=2", "strategy.microbatches=3", *GPT),
     "error: strategy.microbatches=3 is not allowed: a divisor of the pipeline's batch of 4 (the pipeline trains its "
     "whole batch, cut into this many microbatches)"),
    (("model=tiny_cnn", "data.image_size=8", "batch_size=8"),
     "error: strategy=pp is not allowed: a model that names its blocks: strategy=pp cuts the model into stages at "
     "them (add a block_names() method returning the blocks' module names, in order, as harness/rank/gpt.py's GPT "
     "does)"),
    ((*GPT, "strategy.microbatches=3"),
     "error: strategy.microbatches=3 is not allowed: a divisor of the pipeline's batch of 8 (the pipeline trains its "
     "whole batch, cut into this many microbatches)"),
    ((*GPT, "grad_accum=2"),
     "error: grad_accum=2 is not allowed: 1 with strategy=pp: the schedule's microbatches (strategy.microbatches) "
     "are its gradient accumulation"),
    ((*GPT, "amp=O2"),
     "error: amp.level=O2 is not allowed: O0 or O1 with strategy=pp (O2/O3 cast the whole model and keep fp32 masters "
     "of every parameter before it is cut into stages: not wired)"),
    ((*GPT, "compile=true"),
     "error: compile=true is not allowed: false with strategy=pp: its stages are traced graphs run by the schedule; "
     "compiling them is not wired"),
    (("nprocs=4", "model=gpt", "model.layers=2"),
     "error: model.layers=2 is not allowed: at least 4 with strategy=pp on 4 ranks (strategy.schedule=1f1b cuts 4 "
     "stages, each of at least one block), or at most 2 ranks"),
    ((*GPT, "model.layers=3", "strategy.schedule=interleaved_1f1b"),
     "error: model.layers=3 is not allowed: at least 4 with strategy=pp on 2 ranks (strategy.schedule="
     "interleaved_1f1b cuts 4 stages, 2 a rank, each of at least one block), or at most 1 rank"),
    (("model=gpt", "model.tie_embeddings=true"),
     "error: model.tie_embeddings=true is not allowed: false with strategy=pp: the head would share the embedding's "
     "weight across the first and last stages, each training its own copy (embedding.weight, used by stages 0 and "
     "1)"),
])
def test_what_cannot_be_cut_or_run_is_refused_in_one_line_before_anything_starts(
        overrides: tuple[str, ...], line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """The cut's own limits too (fewer blocks than stages, counted as the schedule cuts them; a weight two stages
    would share), seen on the model built on the meta device before anything starts."""
    assert refused_before_start([*PP, *overrides], monkeypatch, capsys) == [line]


class TiedTokens(nn.Module):
    """A user's token model whose output projection is its embedding's weight, used nowhere else (no option says
    so): found by the meta forward, not by a key."""

    seq_len = 8

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(32, 16)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(layers))

    @classmethod
    def inputs(cls, options: Any, data: Any) -> Any:
        from harness.core.inputs import tokens

        return tokens(cls.seq_len, 32)

    def block_names(self) -> list[str]:
        return [f"blocks.{i}" for i in range(len(self.blocks))]

    def forward(self, ids: Any) -> Any:
        x = self.embedding(ids)
        for block in self.blocks:
            x = block(x)
        return F.linear(x, self.embedding.weight)


@pytest.mark.parametrize("overrides, line", [
    (("nprocs=2",),
     "error: model=TiedTokens is not allowed: a model whose stages share no weight with strategy=pp: embedding.weight "
     "is used by stages 0 and 1, each of which would train its own copy (tied weights): untie it"),
    (("nprocs=4",),
     "error: model=TiedTokens is not allowed: a model of at least 4 blocks with strategy=pp on 4 ranks (strategy."
     "schedule=1f1b cuts 4 stages, each of at least one block; its block_names() names 2), or at most 2 ranks"),
])
def test_a_users_model_that_cannot_be_cut_is_refused_by_what_its_built_model_shows(
        overrides: tuple[str, ...], line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """No `layers` or `tie_embeddings` key to name: the model, its block count and the shared weight instead."""
    target = f"model._target_={__name__}.TiedTokens"
    assert refused_before_start(["strategy=pp", *overrides, "model=custom", target], monkeypatch, capsys) == [line]


def test_one_stage_shares_nothing_and_an_untied_model_passes_the_check() -> None:
    """One stage (one rank, gpipe) holds every use of a tied weight; the GPT's untied head is its own weight."""
    from harness.prediction.trace import on_meta
    from harness.rank.gpt import GPT

    tied = on_meta(lambda: GPT(layers=2, width=16, heads=2, seq_len=8, tie_embeddings=True))
    blocks = tied.block_names()
    assert shared_across_stages(tied, blocks, 1) is None
    assert shared_across_stages(tied, blocks, 2) == ("embedding.weight", 0, 1)
    untied = on_meta(lambda: GPT(layers=4, width=16, heads=2, seq_len=8))
    assert shared_across_stages(untied, untied.block_names(), 4) is None


# ---- the cut, the traffic and the bubble ----

def test_blocks_are_split_as_evenly_as_possible_the_later_stages_taking_the_extra_ones() -> None:
    assert block_ranges(4, 2) == [range(0, 2), range(2, 4)]
    assert block_ranges(3, 2) == [range(0, 1), range(1, 3)]
    assert block_ranges(7, 4) == [range(0, 1), range(1, 3), range(3, 5), range(5, 7)]
    assert split_note(4, 2) is None
    assert split_note(3, 2) == ("strategy=pp: 3 blocks over 2 stages split as evenly as possible ([1, 2]): the "
                                "slowest stage sets the pace (2 blocks)")


def test_a_weight_two_stages_use_is_found() -> None:
    tied = nn.Linear(2, 2)
    first, last = nn.Module(), nn.Module()
    first.embedding, last.embedding, last.norm = tied, tied, nn.LayerNorm(2)
    assert shared_parameters([first, last]) == ["embedding.weight", "embedding.bias"]
    assert shared_parameters([first, nn.Linear(2, 2)]) == []


def test_the_traffic_is_each_boundarys_activations_both_ways_every_microbatch() -> None:
    traffic = Pipeline.traffic({"schedule": "gpipe", "microbatches": 8})
    assert [(c.op, c.payload, c.overlap, c.every) for c in traffic.collectives] == [
        ("send_recv", "stage_activations", "forward", "micro_batch"),
        ("send_recv", "stage_activations", "backward", "micro_batch")]
    assert (traffic.microbatches, traffic.stages_per_rank) == (8, 1)
    assert Pipeline.traffic({"schedule": "interleaved_1f1b"}).stages_per_rank == 2
    assert traffic.predictable


def test_the_bubble_by_hand() -> None:
    """(p - 1) / (m + p - 1): 2 ranks, 4 microbatches: 1/5 of the step idle, GPipe and 1F1B alike; interleaved with
    2 stages a rank halves it (1/10); 4 ranks, 8 microbatches: 3/11; one rank, or not a pipeline: none."""
    assert pipeline_bubble(Pipeline.traffic({"schedule": "gpipe", "microbatches": 4}), 2) == pytest.approx(0.2)
    assert pipeline_bubble(Pipeline.traffic({"schedule": "1f1b", "microbatches": 4}), 2) == pytest.approx(0.2)
    assert pipeline_bubble(Pipeline.traffic({"schedule": "interleaved_1f1b", "microbatches": 4}), 2) == \
        pytest.approx(0.1)
    assert pipeline_bubble(Pipeline.traffic({"microbatches": 8}), 4) == pytest.approx(3 / 11)
    assert pipeline_bubble(Pipeline.traffic({}), 1) == 0.0
    from strategies.ddp import TorchDDP

    assert pipeline_bubble(TorchDDP.traffic({}), 4) == 0.0


def test_the_planner_predicts_a_pipeline_on_a_preset_from_its_slowest_stage(monkeypatch) -> None:
    """2 GPUs, a GPT of 2 blocks, batch 8 in 4 microbatches (1F1B): the GPU model times the one-block stage at a
    microbatch of 2, and the step is 5 of its microbatch times (the bubble: 1/5 of the step idle)."""
    from conftest import config_dict
    from hydra.utils import get_class

    from harness.core.config import RunConfig
    from harness.launch.decide import run_plan
    from harness.launch.placement import Hardware
    from harness.prediction import predict as predict_module
    from harness.prediction.hardware import Preset
    from harness.prediction.links import Link
    from harness.prediction.predict import Target, predict

    link = Link(latency_us=2.0, bandwidth_gbps=100.0)
    preset = Preset(name="2 gpus", accelerator="cuda", devices_per_node=2, nodes=1, device_memory_gib=80.0,
                    peak_tflops={"float32": 10.0}, memory_gbps=1000.0, intra=link, inter=link)

    cfg = RunConfig.from_dict(config_dict(nprocs=2, batch_size=8, strategy={"_target_": "strategies.pp.Pipeline"},
                                          model={"_target_": "harness.rank.gpt.GPT", "name": "gpt"}), "pp")
    decided = run_plan(cfg, Hardware(visible_gpus=(), cores=8), in_sweep=True)
    timed: list[tuple[int, int]] = []

    def gpu_time(stage_cfg, amp, preset, micro, ranks, factors=None):
        timed.append((stage_cfg.model["layers"], micro))
        return 0.01, 0.003, {}, ()

    monkeypatch.setattr(predict_module, "gpu_compute_time", gpu_time)
    p = predict(cfg, decided.placement, decided.amp, get_class(cfg.strategy["_target_"]), Target(preset, 1))
    assert timed == [(1, 2)] and p.compute_s == pytest.approx(5 * 0.01) and p.optimizer_s == 0.003
    assert len(p.ranks) == 2 and p.fits
