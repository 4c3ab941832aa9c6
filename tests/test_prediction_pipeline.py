"""A pipeline's prediction (harness.prediction.pipeline, predict_pipeline): the blocks each rank holds, the
microbatches in flight by schedule, one stage's bytes from two traces, the step over the bubble and the sends, all by
hand; and the planner's stage model against a real strategy=pp run's memory."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import run_config
from hydra.utils import get_class

from harness.core.amp_levels import AmpConfig, resolve
from harness.core.traffic import Traffic
from harness.launch.decide import run_plan as place_run
from harness.launch.placement import Hardware
from harness.prediction import pipeline
from harness.prediction import predict as predict_module
from harness.prediction.hardware import load_preset
from harness.prediction.links import Link
from harness.prediction.predict import MIB, Target, predict
from harness.prediction.trace import PhasePeak, StepTrace


def test_blocks_per_rank_follow_the_cut_the_later_stages_taking_the_extra_ones():
    assert pipeline.rank_blocks(4, 2, 1) == [2, 2]
    assert pipeline.rank_blocks(5, 2, 1) == [2, 3]
    # interleaved: 4 stages of 1, 2, 1, 2 blocks (k x 6 // 4 = 0, 1, 3, 4, 6); rank 0 holds stages 0 and 2, rank 1
    # stages 1 and 3
    assert pipeline.rank_blocks(6, 2, 2) == [2, 4]
    assert pipeline.rank_blocks(5, 2, 2) == [2, 3]
    with pytest.raises(pipeline.NotAPipelineModel, match="3 blocks cannot make 4 stages"):
        pipeline.rank_blocks(3, 2, 2)


def test_gpipe_holds_every_microbatch_1f1b_the_ranks_from_it_to_the_last():
    assert [pipeline.in_flight(8, 4, r, all_held=True) for r in range(4)] == [8, 8, 8, 8]
    assert [pipeline.in_flight(8, 4, r, all_held=False) for r in range(4)] == [4, 3, 2, 1]
    assert [pipeline.in_flight(2, 4, r, all_held=False) for r in range(4)] == [2, 2, 2, 1]


def test_interleaved_chunks_in_flight_are_those_torchs_schedule_runs():
    """Interleaved 1F1B on 2 ranks, 2 stages each, 4 microbatches: rank 0 forwards 4 chunks before its first
    backward (torch's `_get_warmup_ops`: (2 - 1) x 2 a round + 2 x 1 rank after it) and each steady step forwards
    before it goes back: 5 in flight; rank 1: 2 + 1. For other shapes, what torch's own action lists for each rank
    (`ScheduleInterleaved1F1B._calculate_single_rank_operations`) hold at most, forwards less full backwards."""
    from torch.distributed.pipelining import schedules

    assert [pipeline.in_flight(4, 2, r, all_held=False, stages_per_rank=2) for r in range(2)] == [5, 3]
    for ranks, stages, microbatches in [(2, 3, 4), (4, 2, 8), (4, 2, 16), (8, 2, 8), (3, 2, 6)]:
        schedule = object.__new__(schedules.ScheduleInterleaved1F1B)  # its order needs no process group
        schedule.n_local_stages, schedule.pp_group_size, schedule._n_microbatches = stages, ranks, microbatches
        schedule.number_of_rounds = max(1, microbatches // ranks)
        schedule.microbatches_per_round = microbatches // schedule.number_of_rounds
        for rank in range(ranks):
            live = most = 0
            for action in filter(None, schedule._calculate_single_rank_operations(rank)):
                live += {schedules._ComputationType.FORWARD: 1,
                         schedules._ComputationType.FULL_BACKWARD: -1}.get(action.computation_type, 0)
                most = max(most, live)
            assert pipeline.in_flight(microbatches, ranks, rank, False, stages) == most, (ranks, stages, rank)


def test_an_interleaved_ranks_sends_alive_at_its_peak_are_those_torchs_schedule_leaves():
    """torch's runtime for interleaved 1F1B waits for its sends at the step's end. 2 ranks of 2 stages, 4
    microbatches (2 a round): rank 0 holds 5 chunks at its peak, 3 backwards done, the first 2 of its second stage
    (each sent a gradient back and left its output sent forward), 1 of its first (its output only): 5; rank 1, 3
    held, 5 done, 2 + 1 of the last stage (a gradient each), 2 of its first (both): 7; 1F1B and GPipe none. For other
    shapes, counted from torch's own action lists (`_calculate_single_rank_operations`) at each rank's peak, a
    backward with the most chunks in flight and the most sent behind it; shared evenly among its stages the first
    and last ranks would be 4.5 and 7.5."""
    from torch.distributed.pipelining import schedules

    assert [pipeline.sends_alive(4, 2, r, 2) for r in range(2)] == [5, 7]
    assert pipeline.sends_alive(4, 2, 0) == pipeline.sends_alive(4, 2, 1) == 0
    for ranks, stages, microbatches in [(4, 2, 8), (4, 2, 16), (8, 2, 8), (3, 2, 6), (2, 3, 4), (4, 4, 8)]:
        schedule = object.__new__(schedules.ScheduleInterleaved1F1B)  # its order needs no process group
        schedule.n_local_stages, schedule.pp_group_size, schedule._n_microbatches = stages, ranks, microbatches
        schedule.number_of_rounds = max(1, microbatches // ranks)
        schedule.microbatches_per_round = microbatches // schedule.number_of_rounds
        last_stage = ranks * stages - 1
        for rank in range(ranks):
            live = sent = 0
            peak = (0, 0)
            for action in filter(None, schedule._calculate_single_rank_operations(rank)):
                if action.computation_type == schedules._ComputationType.FORWARD:
                    live += 1
                elif action.computation_type == schedules._ComputationType.FULL_BACKWARD:
                    peak = max(peak, (live, sent))
                    live -= 1
                    sent += (action.stage_index != 0) + (action.stage_index != last_stage)
            assert pipeline.sends_alive(microbatches, ranks, rank, stages) == peak[1], (ranks, stages, rank)


def test_an_interleaved_rank_receives_for_each_of_its_stages():
    """2 ranks of 2 stages, 4 microbatches of boundary b: rank 0 holds stage 0 (gradients only) and stage 2
    (activations and gradients), rank 1 stage 1 (both) and stage 3, the last (activations only): 12 b each, where
    1F1B's one stage a rank receives 4 b."""
    assert pipeline.receive_buffers(1.0, 4, 0, 2, 2) == 12.0
    assert pipeline.receive_buffers(1.0, 4, 1, 2, 2) == 12.0
    assert pipeline.receive_buffers(1.0, 4, 0, 2) == pipeline.receive_buffers(1.0, 4, 1, 2) == 4.0


def trace(blocks: int, block_acts: int = 30, peak_at_end: bool = False, cast: int = 0) -> StepTrace:
    """A model of `blocks` blocks known by hand, in MiB: each block 10 of parameters, 10 of gradients, 20 of
    momentum, `block_acts` (30) of activations and 7 more while its backward runs; outside the blocks 6 of
    parameters (and gradients, momentum 12) and 9 of activations at the peak, 3 of them the head's backward's (the
    loss's gradients) and 6 saved; its output (the logits) 5, which the whole model's step frees to the loss.
    `peak_at_end`: the step's peak (by total) at the end of backward, its activations 2 whatever the blocks (a block's
    gradients outweighing its activations), what is saved as backward starts unchanged. `cast`: of a block's saved
    tensors, its weights' half copies (autocast's), and 1 of the 6 outside the blocks (the head's)."""
    params, acts = 10 * blocks + 6, block_acts * blocks + 9
    forward = PhasePeak(peak=0, params=params * MIB, masters=0, grads=params * MIB if peak_at_end else 0,
                        optimizer_state=2 * params * MIB, activations=(2 if peak_at_end else acts) * MIB)
    step = PhasePeak(peak=0, params=params * MIB, masters=0, grads=params * MIB, optimizer_state=2 * params * MIB,
                     activations=1 * MIB)
    return StepTrace(peak=0, params=params * MIB, masters=0, grads=0, optimizer_state=2 * params * MIB,
                     activations=acts * MIB, flops=0, model_params=params * MIB, model_grads=params * MIB,
                     stored_params=params * MIB, param_count=0, matrices=(), units=(), tracer="meta",
                     phases=(forward, step), block_backward=7 * MIB, saved_activations=(acts - 3) * MIB,
                     parameter_casts=(cast * blocks + (1 if cast else 0)) * MIB,
                     backward_growth=3 * MIB, output_bytes=5 * MIB)


def test_a_stage_holds_its_blocks_the_ends_their_share_and_its_microbatches_in_flight():
    """Rank 0 of 2 (1F1B, 4 microbatches), 3 blocks, two thirds of what is outside the blocks used before them:
    parameters 30 + 4 of the 6 outside, gradients alive beside the later microbatches (34), momentum 60 + 8,
    activations 2 in flight x (3 blocks x 30 + the stage's output, the boundary's 4) + one block's backward's 7:
    195 (188 without the backward; 101 with it in each microbatch's place). A middle rank holds nothing of the
    outside, and its microbatches' inputs are its receive buffers: 2 x (90 + 4) - 2 x 4 + 7 = 187. The last its
    third of the parameters (2), the 6 saved outside the blocks and the output's 5 a microbatch in flight, less its
    input, the head's backward's 3 once: 90 + 6 + 5 - 4 + 3 = 100."""
    first = pipeline.stage_bytes(trace(3), trace(4), 3, True, False, 2, 4, 4 * MIB, 2 / 3)
    assert (first.params, first.grads, first.state, first.activations) == pytest.approx(
        (34 * MIB, 34 * MIB, 68 * MIB, 195 * MIB))
    middle = pipeline.stage_bytes(trace(3), trace(4), 3, False, False, 2, 4, 4 * MIB, 2 / 3)
    assert (middle.params, middle.grads, middle.activations) == pytest.approx((30 * MIB, 30 * MIB, 187 * MIB))
    last = pipeline.stage_bytes(trace(3), trace(4), 3, False, True, 1, 4, 4 * MIB, 2 / 3)
    assert (last.params, last.activations) == pytest.approx((32 * MIB, 100 * MIB))
    # interleaved, 2 stages a rank of 1 block each: rank 0's 5 chunks each keep a block's 30 and its output's 4,
    # the 2 of its second stage's received, one block's backward 7 on top: 150 + 20 - 8 + 7 = 169 (1F1B's rule,
    # 2 x (2 x 30 + 4) + 7, would say 135); the last rank's 3 chunks, all received, one of them the last stage's
    # with the 6 saved, the output's 5 and the head's backward's 3: 3 x 30 + 2 x 4 + 6 + 5 + 3 - 3 x 4 = 100.
    # And the boundaries each has sent and torch still holds (sends_alive: 5 and 7): 169 + 20 and 100 + 28
    first = pipeline.stage_bytes(trace(2), trace(3), 2, True, False, 5, 4, 4 * MIB, 2 / 3, stages_per_rank=2)
    assert first.activations == pytest.approx(169 * MIB)
    sent = pipeline.stage_bytes(trace(2), trace(3), 2, True, False, 5, 4, 4 * MIB, 2 / 3, stages_per_rank=2, sent=5)
    assert sent.activations == pytest.approx(189 * MIB)
    last = pipeline.stage_bytes(trace(2), trace(3), 2, False, True, 3, 4, 4 * MIB, 2 / 3, stages_per_rank=2, sent=7)
    assert last.activations == pytest.approx(128 * MIB)


def test_a_stage_keeps_what_is_saved_as_backward_starts_not_what_the_traces_peak_left():
    """Where a block's gradients outweigh its activations the whole step's peak comes at the end of backward, its
    activations alike whatever the blocks: the stage's microbatches still keep each block's saved 30. Rank 0 of 2
    under 1F1B as in the test above: 2 x (90 + 4) + 7 = 195, not the 15 the peaks' difference per block (0) gives."""
    first = pipeline.stage_bytes(trace(3, peak_at_end=True), trace(4, peak_at_end=True), 3, True, False, 2, 4,
                                 4 * MIB, 2 / 3)
    assert first.activations == pytest.approx(195 * MIB)


def test_a_stage_keeps_its_weights_half_copies_once_however_many_microbatches_it_holds():
    """Under autocast each block's saved 30 hold its weights' bfloat16 copies, 2 of them, and the head's 1 of the 6
    outside: torch caches a cast within one autocast region, the schedule's step, so the microbatches share them.
    1F1B's rank 0 (2 in flight): 2 x (3 x 28 + 4) + 7 + 3 x 2 = 189 (195 with a copy each); the last rank, 1 in
    flight, as without copies: 3 x 28 + 5 + 5 - 4 + 3 + 3 x 2 + 1 = 100; GPipe's last (4): 4 x 90 + 3 + 7 = 370."""
    first = pipeline.stage_bytes(trace(3, cast=2), trace(4, cast=2), 3, True, False, 2, 4, 4 * MIB, 2 / 3)
    assert first.activations == pytest.approx(189 * MIB)
    last = pipeline.stage_bytes(trace(3, cast=2), trace(4, cast=2), 3, False, True, 1, 4, 4 * MIB, 2 / 3)
    assert last.activations == pytest.approx(100 * MIB)
    gpipe = pipeline.stage_bytes(trace(3, cast=2), trace(4, cast=2), 3, False, True, 4, 4, 4 * MIB, 2 / 3)
    assert gpipe.activations == pytest.approx(370 * MIB)


def test_a_stage_holding_every_microbatch_peaks_in_the_first_backward_beside_the_gradients_it_has_made():
    """GPipe, 4 microbatches on 2 ranks of 3 blocks (as trace's). The last rank holds all 4 as its first backward
    runs, the head's backward once and no gradient yet (the trace's at its peak: 0): 4 x (90 + 6 + 5 - 4) + 3 = 391,
    beside parameters 32 and momentum 64 (1F1B's rule, every gradient beside 4 x (90 + 9), would say 524 in all).
    The first rank's first backward peaks in a block's, beside that block's 10 of gradients: 4 x (90 + 4) + 7 = 383.
    With blocks of 1 of activations, one microbatch fewer beside every gradient is more: 3 x (3 + 11 - 4) + 3 = 33
    beside 32 of gradients (161 in all), where the first backward's 4 x 10 + 3 = 43 beside none is 139."""
    last = pipeline.stage_bytes(trace(3), trace(4), 3, False, True, 4, 4, 4 * MIB, 2 / 3)
    assert (last.grads, last.activations, last.total) == pytest.approx((0, 391 * MIB, 487 * MIB))
    first = pipeline.stage_bytes(trace(3), trace(4), 3, True, False, 4, 4, 4 * MIB, 2 / 3)
    assert (first.grads, first.activations) == pytest.approx((10 * MIB, 383 * MIB))
    light = pipeline.stage_bytes(trace(3, 1), trace(4, 1), 3, False, True, 4, 4, 4 * MIB, 2 / 3)
    assert (light.grads, light.activations, light.total) == pytest.approx((32 * MIB, 33 * MIB, 161 * MIB))


def test_the_embeddings_are_the_first_stages_and_the_head_the_last():
    """GPT (width 64, vocabulary 256, 128 positions): token and position embeddings (256 + 128) x 64 before the
    blocks; the final norm (64 + 64) and the head 256 x 64 after: 24,576 of 41,088."""
    cfg = run_config("pp", nprocs=2, batch_size=8, data={"name": "synthetic"},
                     model={"_target_": "harness.rank.gpt.GPT", "name": "gpt", "seq_len": 128})
    assert pipeline.before_blocks_share(cfg, predict_module.inputs_here(cfg)) == pytest.approx(24576 / 41088)


def test_the_step_is_the_slowest_ranks_microbatches_over_the_bubble_and_two_sends_each():
    gpipe = Traffic(microbatches=4)
    # (m + p - 1) microbatch times: 4 microbatches on 2 ranks idle 1/5 of the step
    assert pipeline.step_seconds(0.01, gpipe, 2) == pytest.approx(5 * 0.01)
    interleaved = Traffic(microbatches=4, stages_per_rank=2)
    assert pipeline.step_seconds(0.01, interleaved, 2) == pytest.approx(0.04 / (1 - 1 / 5 / 2))
    preset = load_preset("h100x8")
    hop = preset.intra.latency_us * 1e-6 + MIB / (preset.intra.bandwidth_gbps * 1e9)
    assert pipeline.sends_seconds(MIB, preset, gpipe, 2) == pytest.approx(2 * 4 * hop)
    assert pipeline.sends_seconds(MIB, preset, gpipe, 1) == 0
    # this machine's link, which adds 0.5 ms to a call after 2 ms of compute (1.0 after 4): each send follows a
    # pass of the stage, half its 6 ms microbatch on average, 3 ms: 0.75 ms more each, 8 sends
    gloo = {"latency_us": 100.0, "bandwidth_gbps": 1.0, "ranks": 2, "after_compute": [[0.002, 5e-4], [0.004, 1e-3]]}
    local = load_preset("local", machine={"accelerator": "cpu", "devices_per_node": 2, "nodes": 1,
                                          "device_memory_gib": 1.0, "memory_gbps": 10.0,
                                          "peak_tflops": {"float32": 0.1, "bfloat16": 0.1, "float16": 0.1},
                                          "intra": {"latency_us": 100.0, "bandwidth_gbps": 1.0},
                                          "inter": {"latency_us": 100.0, "bandwidth_gbps": 1.0},
                                          "per_op": {"broadcast": gloo}})
    bare = 2 * 4 * (100e-6 + MIB / 1e9)
    assert pipeline.sends_seconds(MIB, local, gpipe, 2) == pytest.approx(bare)
    assert pipeline.sends_seconds(MIB, local, gpipe, 2, microbatch_s=0.006) == pytest.approx(bare + 8 * 0.75e-3)
    assert pipeline.receive_buffers(MIB, 4, 0, 3) == 4 * MIB  # gradients from the next stage only
    assert pipeline.receive_buffers(MIB, 4, 1, 3) == 8 * MIB


def test_interleaving_two_stages_a_rank_gains_what_torchtitan_published_within_20_percent():
    """torchtitan's Llama 3.1 405B on 512 H100s, FSDP 8 x TP 8 x PP 8 (TT-2412 Table 5,
    harness/prediction/published_llm.csv): 100 tokens/s a GPU with 1F1B, 128 with interleaved 1F1B, the same run
    otherwise. With 8 stages and torchtitan's default of as many microbatches, the bubble leaves 8/15 of the step
    working under 1F1B and 1 - 7/15/2 = 23/30 interleaved: 1.4375x, within 20 % of the published 1.28x (the rest
    of the step, which no schedule changes, is not in the bubble's ratio: it can only bring it down)."""
    p, m = 8, 8
    one = pipeline.step_seconds(1.0, Traffic(microbatches=m), p)
    two = pipeline.step_seconds(1.0, Traffic(microbatches=m, stages_per_rank=2), p)
    assert (m / one, m / two) == (pytest.approx(8 / 15), pytest.approx(23 / 30))
    assert one / two == pytest.approx(1.4375)
    assert one / two == pytest.approx(128 / 100, rel=0.20)


def test_a_boundary_is_float32_under_autocast_and_the_models_dtype_where_it_is_cast():
    """4 x 128 tokens of width 64: 131072 float32 bytes at O0 and at O1 bf16, whose specs do not cast the model
    (autocast keeps the residual stream, a block's input plus its branches, in float32: strategy=pp at O1 received
    0.5 MiB, not 0.25), 65536 at O2 and O3, whose specs do."""
    cfg = run_config("pp", nprocs=2, batch_size=16, data={"name": "synthetic"},
                     model={"_target_": "harness.rank.gpt.GPT", "name": "gpt", "layers": 4, "seq_len": 128})
    specs = [resolve(AmpConfig(level=level, dtype="bfloat16"), "cpu") for level in ("O0", "O1", "O2", "O3")]
    assert [pipeline.boundary_bytes(cfg, spec, 4, 128) for spec in specs] == [
        4 * 128 * 64 * 4, 4 * 128 * 64 * 4, 4 * 128 * 64 * 2, 4 * 128 * 64 * 2]


def test_the_planner_cuts_the_global_batch_into_microbatches_and_times_the_slowest_stage(monkeypatch):
    """strategy=pp on 2 ranks of a 4-block GPT, global batch 16 in 4 microbatches: every trace and the calibration
    are at microbatches of 4 (not the 8 a rank's data shard holds), the calibrated model has the slowest rank's 2
    blocks, and the step is 5 microbatch times (bubble 1/5) plus 2 x 4 sends of 4 x 128 x 64 floats."""
    traced: list[tuple[int, int]] = []
    calibrated: list[tuple[int, int]] = []

    def fake_trace(model_cfg, inputs, amp, optim, micro, *args, **kwargs):
        traced.append((model_cfg["layers"], micro))
        return trace(model_cfg["layers"])

    class Cal:
        forward_backward_s, optimizer_s = 0.01, 0.002

        def as_dict(self):
            return {"busy": None}

    def fake_calibrate(cfg, amp, micro, threads):
        calibrated.append((cfg.model["layers"], micro))
        return Cal()

    monkeypatch.setattr(predict_module, "trace_step", fake_trace)
    monkeypatch.setattr(predict_module, "calibrate_fn_default", fake_calibrate)
    cfg = run_config("pp", nprocs=2, batch_size=16, data={"name": "synthetic"},
                     model={"_target_": "harness.rank.gpt.GPT", "name": "gpt", "layers": 4, "seq_len": 128})
    decided = place_run(cfg, Hardware(visible_gpus=(), cores=2), in_sweep=True)
    # a machine measured as this one is (its compute calibrated), with h100x8's link for hand-checkable sends
    measured = dataclasses.replace(load_preset("h100x8"), measured=True)
    p = predict(cfg, decided.placement, decided.amp, get_class(cfg.strategy["_target_"]), Target(measured, 1))
    assert {micro for _, micro in traced} == {4} and calibrated == [(2, 4)]
    assert p.compute_s == pytest.approx(5 * 0.01) and p.optimizer_s == 0.002
    boundary = 4 * 128 * 64 * 4
    link: Link = measured.intra
    assert p.comm_s == pytest.approx(2 * 4 * (link.latency_us * 1e-6 + boundary / (link.bandwidth_gbps * 1e9)))
    # the last rank: its blocks, the 6 saved outside them and the output's 5, less its input (a receive buffer), the
    # head's backward's 3
    assert [r.activations_mib for r in p.ranks] == pytest.approx([2 * (2 * 30 + boundary / MIB) + 7,
                                                                  2 * 30 + 6 + 5 - boundary / MIB + 3])


def test_the_slowest_stage_is_timed_through_the_schedule_itself(monkeypatch):
    """plan.calibration=strategy: the slowest stage (2 of 4 blocks) as a model of its own through strategy=pp in a
    process group of one, its 4 microbatches of 4 sequences (the pipeline's batch of 16) in 60 ms: 15 ms a
    microbatch, and 1F1B on 2 ranks takes 4 microbatches over 1 - 1/5 of the step: 5 x 15 ms. Not the whole model's
    (100 ms: 5 x 25), not the bare stage's (10 ms: 5 x 10), not the bare stage times the whole model's ratio through
    the schedule (100 / 4 / 20 = 1.25x: 5 x 12.5, two noisy timings more, which moved the prediction by 12 %)."""
    monkeypatch.setattr(predict_module, "trace_step", lambda model_cfg, *a, **k: trace(model_cfg["layers"]))

    class Cal:
        threads = 1

        def __init__(self, seconds: float) -> None:
            self.forward_backward_s, self.optimizer_s = seconds, 0.002

        def as_dict(self):
            return {"busy": None}

    through: list[tuple[int, int, int]] = []

    def fake_strategy(cfg, placement, amp, micro, tensor_parallel=1, pipeline_batch=0):
        through.append((cfg.model["layers"], micro, pipeline_batch))
        return Cal(0.06 if cfg.model["layers"] == 2 else 0.1)

    bare: list[int] = []

    def fake_bare(cfg, amp, micro, threads):
        bare.append(cfg.model["layers"])
        return Cal(0.01 if cfg.model["layers"] == 2 else 0.02)

    monkeypatch.setattr(predict_module, "calibrate_fn_default", fake_bare)
    monkeypatch.setattr(predict_module, "calibrate_strategy_default", fake_strategy)
    cfg = run_config("pp", nprocs=2, batch_size=16, data={"name": "synthetic"},
                     plan={"calibration": "strategy", "predict": False},
                     model={"_target_": "harness.rank.gpt.GPT", "name": "gpt", "layers": 4, "seq_len": 128})
    decided = place_run(cfg, Hardware(visible_gpus=(), cores=2), in_sweep=True)
    measured = dataclasses.replace(load_preset("h100x8"), measured=True)
    p = predict(cfg, decided.placement, decided.amp, get_class(cfg.strategy["_target_"]), Target(measured, 1))
    assert through == [(2, 4, 16)] and bare == []
    assert p.compute_s == pytest.approx(5 * 0.015) and p.optimizer_s == 0.002
    assert any("through strategy=pp in a process group of one, 4 microbatches of 4 sequences" in a
               for a in p.assumptions)


def test_an_interleaved_ranks_stages_are_timed_as_one_through_1f1b(monkeypatch):
    """strategy.schedule=interleaved_1f1b on 2 ranks of a 4-block GPT: a rank's two stages of one block each, which
    in a process group of one would send to the same rank (gloo refuses: "Pair is not connected", and no
    interleaved pipeline was predicted on this machine), are calibrated as its 2 blocks through 1F1B: 60 ms for 4
    microbatches, 15 ms each; the step is interleaving's, 4 x 15 ms over 1 - 1/10 of idle (not 1F1B's 1/5)."""
    monkeypatch.setattr(predict_module, "trace_step", lambda model_cfg, *a, **k: trace(model_cfg["layers"]))

    class Cal:
        threads, forward_backward_s, optimizer_s = 1, 0.06, 0.002

        def as_dict(self):
            return {"busy": None}

    through: list[tuple[int, str]] = []

    def fake_strategy(cfg, placement, amp, micro, tensor_parallel=1, pipeline_batch=0):
        through.append((cfg.model["layers"], cfg.strategy["schedule"]))
        return Cal()

    monkeypatch.setattr(predict_module, "calibrate_strategy_default", fake_strategy)
    cfg = run_config("pp", nprocs=2, batch_size=16, data={"name": "synthetic"},
                     plan={"calibration": "strategy", "predict": False},
                     model={"_target_": "harness.rank.gpt.GPT", "name": "gpt", "layers": 4, "seq_len": 128},
                     strategy={**run_config("pp").strategy, "schedule": "interleaved_1f1b"})
    decided = place_run(cfg, Hardware(visible_gpus=(), cores=2), in_sweep=True)
    measured = dataclasses.replace(load_preset("h100x8"), measured=True)
    p = predict(cfg, decided.placement, decided.amp, get_class(cfg.strategy["_target_"]), Target(measured, 1))
    assert through == [(2, "1f1b")] and cfg.strategy["schedule"] == "interleaved_1f1b"
    assert p.compute_s == pytest.approx(4 * 0.015 / 0.9)
    assert any("the rank's 2 stages timed as one through 1F1B" in a for a in p.assumptions)
    # each rank's memory with what it has sent and torch holds (sends_alive: 5 and 7 boundaries of 4 x 128 x 64 x 4
    # bytes, b): rank 0 5 chunks of 30, their outputs less the 2 received, a block's backward 7, 5 sent: 157 + 8 b;
    # rank 1 3 chunks, the last stage's 6 saved, its output 5 and head backward 3, 2 outputs, 3 received, 7 sent
    b = 4 * 128 * 64 * 4 / MIB
    assert [r.activations_mib for r in p.ranks] == pytest.approx([157 + 8 * b, 104 + 6 * b])


def test_fsdp_by_pp_is_two_pipelines_each_stage_halved_and_gathered_whole(monkeypatch):
    """strategy=fsdp strategy.pp=2 on 4 ranks with a global batch of 32: two pipelines of 2 ranks, each on 16
    sequences in 4 microbatches of 4, so every trace and calibration is the one strategy=pp on 2 ranks with a batch
    of 16 makes. Rank r holds stage r // 2: its parameters, gradients and momentum halved over the two pipelines,
    beside the stage gathered whole (the all-gather's output and the parameters it is copied into) and its whole
    gradients; the optimizer steps half; each step gathers the stage before each microbatch's forward and backward
    (8) and reduce-scatters its gradients once, over 2 ranks of h100x8's NVLink, waited for."""
    monkeypatch.setattr(predict_module, "trace_step", lambda model_cfg, *a, **k: trace(model_cfg["layers"]))

    class Cal:
        forward_backward_s, optimizer_s = 0.01, 0.002

        def as_dict(self):
            return {"busy": None}

    monkeypatch.setattr(predict_module, "calibrate_fn_default", lambda *args: Cal())
    gpt = {"_target_": "harness.rank.gpt.GPT", "name": "gpt", "layers": 4, "seq_len": 128}
    measured = dataclasses.replace(load_preset("h100x8"), measured=True)

    def planned(name: str, nprocs: int, batch: int, **options: object):
        cfg = run_config(name, nprocs=nprocs, batch_size=batch, data={"name": "synthetic"}, model=gpt,
                         strategy={"_target_": get_class_path(name), **options})
        decided = place_run(cfg, Hardware(visible_gpus=(), cores=4), in_sweep=True)
        return predict(cfg, decided.placement, decided.amp, decided.strategy_cls, Target(measured, 1))

    alone = planned("pp", 2, 16)
    both = planned("fsdp", 4, 32, pp=2)
    assert both.world_size == 4 and len(both.ranks) == 4
    assert both.compute_s == pytest.approx(alone.compute_s) and both.optimizer_s == pytest.approx(0.002 / 2)
    for rank, stage in zip(both.ranks, (0, 0, 1, 1), strict=True):
        one = alone.ranks[stage]
        assert (rank.params_mib, rank.grads_mib, rank.optimizer_mib) == pytest.approx(
            (one.params_mib / 2, one.grads_mib / 2, one.optimizer_mib / 2))
        assert rank.activations_mib == pytest.approx(one.activations_mib)
        assert rank.comm_buffers_mib == pytest.approx(one.comm_buffers_mib + 2 * one.params_mib + one.grads_mib)
    first = alone.ranks[0]
    link: Link = measured.intra
    gather = pipeline.collective_seconds("all_gather", first.params_mib * MIB, 2, 1, link, measured.inter,
                                         measured.per_op)
    scatter = pipeline.collective_seconds("reduce_scatter", first.grads_mib * MIB, 2, 1, link, measured.inter,
                                          measured.per_op)
    assert both.comm_s == pytest.approx(alone.comm_s + 8 * gather + scatter)


def get_class_path(name: str) -> str:
    from conftest import STRATEGY_TARGETS

    return STRATEGY_TARGETS[name]
