"""Mutation check of the figures the harness reports: apply each wrong-but-plausible change to a copy of the
repository, run the tests that cover it (slow ones included), and say which test caught it ("killed") or that
none did ("survived").

    python bench/mutants.py [--only NAME ...] [--write-results]
    python bench/mutants.py --quick      # every mutant's text still in the code, and one mutant run (seconds)

Each mutant is one textual replacement that must match exactly once; a mutant whose text is no longer in the
code is "stale" (update the list with the code: tests/test_mutants.py fails until then). Its tests: the module's
mirrors (tests/test_<module>.py, test_<package>.py, test_<package>_<module>.py) and those the mutant names, every
marker but `bench` and `gpu`; only where all of them pass, the whole fast suite (`-m "not slow"`) as a last chance.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import common

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...] = ()  # beyond the mirrors: the tests that cover this figure (files or node ids)


MUTANTS: list[Mutant] = [Mutant(*entry) for entry in (  # type: ignore[arg-type]
    # (name, file, original text, mutated text) -- the first ten from issue 13, then our own
    ("s/20 mean, not median", "harness/report/rows.py",  # each run's figure, which the row's level pools
     "return statistics.median(w.seconds * PER", "return statistics.fmean(w.seconds * PER"),
    ("throughput interval not narrowed by the runs", "harness/verdict/intervals.py",
     "half = _t(self.df_residual) * self.s_residual / math.sqrt(self.runs(key))",
     "half = _t(self.df_residual) * self.s_residual"),
    ("s/20 not scaled by log_every", "harness/report/rows.py",
     "steady = [w.seconds * PER / (r.log_every or 1)", "steady = [w.seconds"),
    ("img/s and speedup columns swapped", "harness/report/columns.py",
     'Column(f"{_rate(rows)} [95 %]", lambda r: fmt(r.throughput, 1)', 'Column(f"{_rate(rows)} [95 %]", lambda r: fmt(r.speedup, 2)'),
    ("a win the verdict did not decide", "harness/report/decision.py",
     'if state.decided == "winner":\n        result["throughput"]',
     'if state.leader is not None:\n        result["throughput"]'),
    ("throughput from the per-rank batch", "harness/launch/runner.py",
     "steady_throughput(windows, cfg.batch_size,", "steady_throughput(windows, decided.placement.local_batch,"),
    ("spawn launcher drops a raised failure", "harness/launch/launcher.py",
     "return [WorkerFailure(rank=rank, pid=process.pid, exitcode=process.exitcode, message=message)]",
     "return []"),
    ("gloo not pinned to loopback", "harness/launch/launcher.py",
     '"GLOO_SOCKET_IFNAME": interface, ', ""),
    ("DataParallel syncs only its first GPU", "harness/core/devices.py",
     "for index in self.indices:\n                torch.cuda.synchronize(index)",
     "for index in self.indices[:1]:\n                torch.cuda.synchronize(index)"),
    ("CPU sampler never re-lists the workers", "harness/memory/sampler.py",
     "if self._clock() - self._listed_at >= self.RELIST_S:", "if self._listed_at == float(\"-inf\"):"),
    # timing
    ("run clock = fastest rank", "harness/core/timing.py",
     "cumulative = max(w[i].cumulative_seconds for w in ranks)", "cumulative = min(w[i].cumulative_seconds for w in ranks)"),
    ("throughput includes warm-up", "harness/core/timing.py",
     "    steady = steady_windows(windows)\n    seconds = sum(w.seconds for w in steady)\n    if not steady or seconds <= 0:\n",
     "    steady = list(windows)\n    seconds = sum(w.seconds for w in steady)\n    if not steady or seconds <= 0:\n"),
    ("one warm-up window too many", "harness/core/timing.py",
     "warmup=len(self.windows) < self._warmup_windows", "warmup=len(self.windows) <= self._warmup_windows"),
    ("window loss = mean over ranks dropped (rank 0's)", "harness/core/timing.py",
     "loss=statistics.fmean(losses) if losses else None", "loss=losses[0] if losses else None"),
    # report
    ("p10 and p90 swapped", "harness/report/rows.py",
     "row.s_per_20_p10, row.s_per_20_p90 = percentile(steady, 10), percentile(steady, 90)",
     "row.s_per_20_p10, row.s_per_20_p90 = percentile(steady, 90), percentile(steady, 10)"),
    ("speedup inverted", "harness/report/rows.py",
     "row.speedup, row.speedup_lo, row.speedup_hi = compared.ratio, compared.lo, compared.hi",
     "row.speedup, row.speedup_lo, row.speedup_hi = 1 / compared.ratio, compared.lo, compared.hi"),
    ("efficiency not per device", "harness/report/rows.py",
     "row.efficiency = row.throughput / (reference.throughput * row.n_devices)",
     "row.efficiency = row.throughput / reference.throughput"),
    ("efficiency against any amp level", "harness/report/rows.py",
     "== (other.amp, other.impl, other.dtype, other.model, other.global_batch",
     "== (self.amp, self.impl, self.dtype, other.model, other.global_batch"),
    ("memory: first repeat, not the median", "harness/memory/report.py",
     "max_mib=statistics.median(maxima)", "max_mib=maxima[0]"),
    ("a win with unknown spread", "harness/report/rows.py",
     "row.spread_known = level.known", "row.spread_known = True"),
    ("memory win ignores the spread", "harness/report/decision.py",
     "mem[0][0].max_hi < mem[1][0].max_lo", "mem[0][0].max_mib < mem[1][0].max_mib"),
    # imbalance
    ("base excess against the largest other", "harness/memory/imbalance.py",
     "others_mean = statistics.fmean(r[\"used_mib\"] for r in others)", "others_mean = max(r[\"used_mib\"] for r in others)"),
    ("used memory = peak, baseline ignored", "harness/memory/imbalance.py",
     "max(0.0, (d.peak_mib or 0.0) - (d.baseline_mib or 0.0))", "(d.peak_mib or 0.0)"),
    ("CPU verdict as if GPUs", "harness/memory/imbalance.py",
     'if results.memory.source == "psutil":', "if False:"),
    # memory
    ("baseline counted as a peak", "harness/memory/sampler.py",
     "            self.baseline = sample\n            return\n", "            self.baseline = sample\n"),
    ("other users' processes kept", "harness/memory/sampler.py",
     "elif rank is None and pid in before and pid != launcher_pid:", "elif False:"),
    ("hidden per-process memory = 0", "harness/memory/sampler.py",
     "None if used is None else used / MIB", "(used or 0) / MIB"),
    ("CPU baseline from the sampler, not the rank's start", "harness/memory/sampler.py",
     "if rank is not None and rank.rss_at_start_mib is not None:", "if False:"),
    # amp
    ("static loss scale not divided out", "amp/native.py",
     "torch._foreach_div_(grads, self.static_scale)", "pass"),
    ("skipped steps not counted", "amp/native.py",
     "self._skipped += flag.to(self._skipped.device, torch.int64)", "pass"),
    ("O2 masters not copied back", "amp/native.py",
     "torch._foreach_copy_(self._model_params, self._master_params)", "pass"),
    # allreduce
    ("allreduce sums, never averages", "strategies/allreduce.py",
     "        grad.div_(world)\n", ""),
    ("allreduce divides after the sum", "strategies/allreduce.py",
     "        grad.div_(world)\n        dist.all_reduce(grad, op=dist.ReduceOp.SUM)",
     "        dist.all_reduce(grad, op=dist.ReduceOp.SUM)\n        grad.div_(world)"),
    ("bucketed allreduce not copied back", "strategies/allreduce.py", "grad.copy_(synced)", "pass"),
    # runner, results, devices, collectives
    ("root cause = the last rank to fail", "harness/launch/runner.py",
     "key=lambda r: r.ended_at or 0)", "key=lambda r: -(r.ended_at or 0))"),
    ("results overwrite another run", "harness/core/results.py",
     "if path.exists() and not _is_provisional(path):", "if False:"),
    ("batch not checked against the workers", "harness/launch/placement.py",
     "if global_batch is not None and global_batch % shares:", "if False:"),
    ("all_reduce bus factor (n-1)/n", "harness/collectives/arithmetic.py", "return 2 * (n - 1) / n", "return (n - 1) / n"),
    ("collective time: mean", "harness/collectives/arithmetic.py",
     'seconds = statistics.median(m["seconds"])', 'seconds = statistics.fmean(m["seconds"])'),
    # issues 16-18: the figures the newer strategies, parity and the breakdown report
    ("data wait share includes warm-up", "harness/core/timing.py",
     "    steady = steady_windows(windows)\n    seconds = sum(w.seconds for w in steady)\n    if not steady or seconds <= 0 or any(",
     "    steady = list(windows)\n    seconds = sum(w.seconds for w in steady)\n    if not steady or seconds <= 0 or any("),
    ("ZeRO's optimizer state not divided by the ranks", "harness/memory/footprint.py",
     '"optimizer_state": whole.optimizer_state / (over if state else 1)', '"optimizer_state": whole.optimizer_state'),
    ("parity: the first repeat's difference, not the largest", "harness/parity/report.py",
     "max_rel = max(rel_diffs) if rel_diffs else None", "max_rel = rel_diffs[0] if rel_diffs else None"),
    ("parity: losses not compared", "harness/parity/report.py",
     "loss_diffs.append(max(abs(a - b) for a, b in zip(ours, base, strict=False)))", "loss_diffs.append(0.0)"),
    ("compile time: the fastest rank's", "harness/core/rank_record.py",  # the merge RankRecord declares
     '"max": max,', '"max": min,', ("tests/test_runner.py", "tests/test_report_figures.py")),
    ("breakdown shares 10 % off", "harness/profile/breakdown.py",
     '"shares": {k: (v / span_s if span_s > 0 else None)', '"shares": {k: (v / (span_s * 1.1) if span_s > 0 else None)'),
    # issue 50: the newer features' headline figures. Tokens/s and MFU
    ("the verdict's tokens/s shown as samples/s", "harness/report/decision.py",
     'f"{best.throughput * tokens:.0f} tokens/s"', 'f"{best.throughput:.0f} tokens/s"', ("tests/test_verdict_replays.py",)),
    ("the table's tok/s = samples/s", "harness/report/columns.py",
     "return samples_s * r.tokens_per_sample if", "return samples_s if",
     ("tests/test_verdict_replays.py", "tests/test_gpt.py", "tests/test_report.py")),
    ("results' tokens/s = samples/s", "harness/launch/runner.py",
     "throughput_tokens_s=samples_s * decided.inputs.tokens_per_sample", "throughput_tokens_s=samples_s",
     ("tests/test_gpt.py",)),
    ("MFU without its device count", "harness/launch/runner.py",
     "/ (devices * peak_tflops * 1e12)", "/ (peak_tflops * 1e12)"),
    ("the plan table's tokens/s = sequences/s", "harness/planning.py",
     "return f\"{_figure(samples_s * (tokens or 1))}", "return f\"{_figure(samples_s)}", ("tests/test_plan_table.py",)),
    ("the plan table rounds rates to whole numbers", "harness/planning.py",
     'return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"', 'return f"{value:,.0f}"',
     ("tests/test_plan_table.py",)),
    # the verdict sentence
    ("winner and runner-up swapped", "harness/report/decision.py",
     'parts.append(f"Fastest: {best.label}, {said}; {_ratio_words(m)} the runner-up {state.runner_up} "',
     'parts.append(f"Fastest: {state.runner_up}, {said}; {_ratio_words(m)} the runner-up {best.label} "',
     ("tests/test_verdict_replays.py", "tests/test_report.py")),
    ("a tie called a win", "harness/verdict/racing.py",
     'decided = "tie" if tied else "winner"', 'decided = "winner"', ("tests/test_verdict_rule.py", "tests/test_report.py")),
    ("the runner-up is the slowest", "harness/verdict/racing.py",
     "runner_up = ranked[1]", "runner_up = ranked[-1]", ("tests/test_verdict_replays.py", "tests/test_report.py")),
    # the rule
    ("the sweep's alpha not divided over its pairs", "harness/verdict/rule.py",
     "return self.alpha / max(1, self.pairs)", "return self.alpha"),
    ("equivalence at the (1 - level) interval", "harness/verdict/rule.py",
     "within = (_exp(mean - _t(2 * level, n - 1) * se), _exp(mean + _t(2 * level, n - 1) * se))", "within = (lo, hi)"),
    ("paired SD over n, not n - 1", "harness/verdict/rule.py",
     "sd = math.sqrt(sum((d - mean) ** 2 for d in log_ratios) / (n - 1))",
     "sd = math.sqrt(sum((d - mean) ** 2 for d in log_ratios) / n)"),
    ("rounds advised for half the power", "harness/verdict/rule.py",
     "effect * math.sqrt(n) / sd)) >= POWER:", "effect * math.sqrt(n) / sd)) >= 0.5:"),
    ("interim looks spend the whole alpha", "harness/verdict/sequential.py",
     "share = (1 - FINAL_SHARE) * alpha", "share = alpha", ("tests/test_verdict_rule.py",)),
    ("spending function upside down (early looks spend most)", "harness/verdict/sequential.py",
     "norm.ppf(1 - alpha / 2) / math.sqrt(t)", "norm.ppf(1 - alpha / 2) * math.sqrt(t)", ("tests/test_verdict_rule.py",)),
    # compare and projection
    ("--compare's ratio A over B", "harness/report/compare.py",
     "{rows_b[key].label: ([v for _, v in rows_a[key].run_throughputs], [v for _, v in rows_b[key].run_throughputs])",
     "{rows_b[key].label: ([v for _, v in rows_b[key].run_throughputs], [v for _, v in rows_a[key].run_throughputs])"),
    ("projection: the global batch not scaled to the preset", "harness/report/projection.py",
     "scaled = dataclasses.replace(cfg, batch_size=per_rank * devices, gpus=None)",
     "scaled = dataclasses.replace(cfg, batch_size=per_rank, gpus=None)", ("tests/test_prediction_report.py",)),
    ("projection: DDP on one node of a multi-node preset", "harness/report/projection.py",
     "devices = preset.devices if strategy_cls.one_process_per_device else",
     "devices = preset.devices_per_node if strategy_cls.one_process_per_device else", ("tests/test_prediction_report.py",)),
    # the planner
    ("ZeRO/FSDP optimizer time not divided by the ranks", "harness/prediction/predict.py",
     "            optimizer /= traffic.sharded_over(n)\n", "            pass\n"),
    ("plan: FSDP over the world timed in a group of one", "harness/prediction/predict.py",
     "sharded = n if strategy_cls.shards[0] and tp == 1", "sharded = 1 if strategy_cls.shards[0] and tp == 1",
     ("tests/test_prediction_predict.py",)),
    ("plan: TP's residual-stream calls in the projections' half type", "harness/prediction/predict.py",
     "dtype = (self.residual_dtype or self.dtype) if residual else self.dtype", "dtype = self.dtype",
     ("tests/test_tp.py",)),
    ("plan: a pipeline stage's block backward left out", "harness/prediction/pipeline.py",
     "if heads else more.block_backward", "if heads else 0", ("tests/test_prediction_pipeline.py",)),
    ("plan: the last stage's head backward in every microbatch's place", "harness/prediction/pipeline.py",
     "(saved_rest + fewer.output_bytes)", "(saved_rest + backward + fewer.output_bytes)",
     ("tests/test_prediction_pipeline.py",)),
    ("plan: the last stage keeps no output", "harness/prediction/pipeline.py",
     "(saved_rest + fewer.output_bytes)", "(saved_rest)", ("tests/test_prediction_pipeline.py",)),
    ("plan: a stage's input counted beside its receive buffer", "harness/prediction/pipeline.py",
     " - min(n, received) * boundary", "", ("tests/test_prediction_pipeline.py",)),
    ("plan: GPipe's peak beside every gradient", "harness/prediction/pipeline.py",
     "        if not all_held:\n", "        if True:\n", ("tests/test_prediction_pipeline.py",)),
    ("plan: a stage's saved tensors from the traces' peaks", "harness/prediction/pipeline.py",
     "saved_block = more.saved_activations - fewer.saved_activations - cast_block",
     "saved_block = more.phases[0].activations - fewer.phases[0].activations - cast_block",
     ("tests/test_prediction_pipeline.py",)),
    ("plan: a stage's weight casts kept by every microbatch", "harness/prediction/pipeline.py",
     "cast_block = more.parameter_casts - fewer.parameter_casts", "cast_block = 0",
     ("tests/test_prediction_pipeline.py",)),
    ("plan: an interleaved rank's sends shared evenly among its stages", "harness/prediction/pipeline.py",
     "    return 2 * done - (on(0) if rank == 0 else 0)",
     "    return 2 * done - (done // stages_per_rank if rank == 0 else 0)", ("tests/test_prediction_pipeline.py",)),
    ("plan: an interleaved rank's sends freed as they go", "harness/prediction/predict.py",
     "pipeline.sends_alive(m, n, r, traffic.stages_per_rank)))", "0))", ("tests/test_prediction_pipeline.py",)),
    ("trace: a leaf input's cast counted as a parameter's", "harness/prediction/trace.py",
     'isinstance(getattr(f, "variable", None), nn.Parameter)', 'hasattr(f, "variable")',
     ("tests/test_prediction_trace.py",)),
    ("plan: interleaved chunks in flight as 1F1B's microbatches", "harness/prediction/pipeline.py",
     "    if stages_per_rank == 1:\n        return min(schedule_microbatches, ranks - rank)",
     "    if True:\n        return min(schedule_microbatches, ranks - rank)", ("tests/test_prediction_pipeline.py",)),
    ("plan: an interleaved rank's stages calibrated as its own schedule", "harness/prediction/predict.py",
     "            looped = traffic.stages_per_rank > 1\n", "            looped = False\n",
     ("tests/test_prediction_pipeline.py",)),
    ("plan: a shard's measured step halved again", "harness/prediction/predict.py",
     'if any(strategy_cls.shards[2:]) and not calibration.get("one_sharded_rank"):',
     "if any(strategy_cls.shards[2:]):", ("tests/test_prediction_predict.py",)),
    ("plan: ZeRO's optimizer state not sharded", "harness/prediction/predict.py",
     "state = peak.optimizer_state / over if state_sharded else", "state = peak.optimizer_state if state_sharded else"),
    ("plan: inputs of the global batch on every rank", "harness/prediction/predict.py",
     "local_batch = cfg.batch_size // (n // traffic.tensor_parallel_over(n))", "local_batch = cfg.batch_size"),
    ("plan: a TP rank's inputs a data-parallel rank's share", "harness/prediction/predict.py",
     "local_batch = cfg.batch_size // (n // traffic.tensor_parallel_over(n))", "local_batch = cfg.batch_size // n"),
    ("plan: a measured TP rank less every gradient, not those alive at its peak", "harness/prediction/predict.py",
     "grads = trace.phases[0].grads if trace.phases else trace.grads", "grads = trace.model_grads"),
    ("probe: a reused address not taken as an unseen free", "harness/core/tensor_peak.py",
     "            live -= allocated.pop(address, 0)\n", ""),
    ("plan: DataParallel's replicas hold the optimizer state", "harness/prediction/predict.py",
     "others = [rank(label, trace.params, trace.grads, 0, trace.activations, 0, 0)",
     "others = [rank(label, trace.params, trace.grads, state, trace.activations, 0, 0)", ("tests/test_planning.py",)),
    ("plan: overlap hides the whole collective", "harness/prediction/predict.py",
     "covered = min(seconds - last, hidden_budget[collective.overlap])",
     "covered = min(seconds, hidden_budget[collective.overlap])"),
    ("plan: FSDP's gathers once a step, not every micro-batch", "harness/prediction/predict.py",
     'times = micro_batches if collective.every == "micro_batch" else 1', "times = 1"),
    # what a call adds after compute (this machine's link), and sequence parallelism's norms
    ("plan: each FSDP unit's and DDP bucket's call after compute counted once", "harness/prediction/predict.py",
     "(1 if one else pieces) * times))", "times))"),
    ("plan: a run of calls back to back, one a parameter, each after compute", "harness/prediction/predict.py",
     'one = not unit_calls and collective.overlap == "none"', "one = False"),
    ("plan: TP's calls after compute once a micro-batch, not each call", "harness/prediction/predict.py",
     '(len(tp_calls) if collective.payload == "activations" else 1) * times))', "times))"),
    ("plan: a call after compute pays the next gap's cost, not the share's", "harness/prediction/links.py",
     "return below[1] + (compute_s - below[0]) / (above[0] - below[0]) * (above[1] - below[1])",
     "return above[1]", ("tests/test_prediction_predict.py",)),
    ("plan: a pipeline's send after a whole microbatch's pass, not half", "harness/prediction/pipeline.py",
     "after_s=microbatch_s / 2)", "after_s=microbatch_s)"),
    ("plan: sequence parallelism's norm gradients all-reduced every micro-batch", "strategies/tp.py",
     'Collective("all_reduce", "whole_grads", "none", group="tp", calls="per_param"))',
     'Collective("all_reduce", "whole_grads", "none", group="tp", every="micro_batch", calls="per_param"))',
     ("tests/test_prediction_predict.py",)),
    ("plan: HSDP's state divided by the world, not the shard group", "harness/core/traffic.py",
     "return max(1, world_size // self.replicate)", "return world_size", ("tests/test_hsdp.py",)),
    ("GPU model: a preset's kernel share ignored", "harness/prediction/gpu_model.py",
     "efficiency = np.array([getattr(factors, c.compute) * shares.get(c.compute, 1.0) if c.compute else 1.0",
     "efficiency = np.array([getattr(factors, c.compute) if c.compute else 1.0"),
    ("GPU model: a fused kernel's temporaries read from memory", "harness/prediction/gpu_model.py",
     "if key not in fused.made and key not in fused.read:", "if key not in fused.read:"),
    ("plan: all-reduce bus bytes halved", "harness/prediction/links.py",
     "return latency * 1e-6 + bus_factor(op, n) * size_bytes / (bandwidth * GB)",
     "return latency * 1e-6 + bus_factor(op, n) * size_bytes / (2 * bandwidth * GB)"),
    ("plan: a group with one rank a node crosses at the node's whole link", "harness/prediction/links.py",
     "share = min(1.0, group_ranks / node_devices) if node_devices > 0 else 1.0", "share = 1.0",
     ("tests/test_tp.py", "tests/test_hsdp.py")),
    ("DDP: one bucket more held beside the buckets", "strategies/ddp.py",
     "            buffers += (Buffer(\"bucket\", dtype=HOOK_DTYPE[hook], bucket_cap_mb=o[\"bucket_cap_mb\"]),)\n        return",
     "            buffers += (Buffer(\"bucket\", dtype=HOOK_DTYPE[hook], bucket_cap_mb=o[\"bucket_cap_mb\"]),)\n"
     "        else:\n            buffers += (Buffer(\"bucket\", bucket_cap_mb=o[\"bucket_cap_mb\"]),)\n        return",
     ("tests/test_prediction_predict.py",)),
    # the search
    ("search cost per run over the space, not the runs", "harness/search/answer.py",
     "per_run = took / record.runs", "per_run = took / record.space"),
    ("search cost: the grid counted for one round", "harness/search/answer.py",
     "grid_runs = record.space * rounds", "grid_runs = record.space"),
    ("search prunes against the slowest, not the best", "harness/search/prune.py",
     "best_key = min(fitting,", "best_key = max(fitting,", ("tests/test_search_space.py",)),
    # energy per image (NVML's counter)
    ("J/image: one GPU's energy", "harness/launch/activity.py",
     "per_image = sum(energies) / images", "per_image = energies[0] / images", ("tests/test_memory.py",)),
    ("J/image: the counter at the reading before, not interpolated", "harness/launch/activity.py",
     "return e0 + (e1 - e0) * (t - t0) / (t1 - t0)", "return e0", ("tests/test_memory.py",)),
    ("J/image: warm-up windows counted", "harness/launch/activity.py",
     "if not w.warmup and not w.profiled]", "if not w.profiled]", ("tests/test_memory.py",)),
    # NVML inside a container, and the planner's GPU memory
    ("container: NVML's host PIDs left unmatched", "harness/memory/sampler.py",
     "        _match_host_pids(per_process, rank_of_pid)\n", "        pass\n"),
    ("plan: the GPU's used memory taken for its total", "harness/prediction/targets.py",
     "pynvml.nvmlDeviceGetHandleByIndex(0)).total / GIB", "pynvml.nvmlDeviceGetHandleByIndex(0)).used / GIB",
     ("tests/test_prediction_hardware.py",)),
    ("plan: GPU memory through CUDA in the parent when NVML fails", "harness/prediction/targets.py",
     "            return _total_memory_in_a_child() / GIB", "            return torch.cuda.get_device_properties(0).total_memory / GIB",
     ("tests/test_prediction_hardware.py",)),
    # apex's frontend: options apex refuses at O1 are not passed there
    ("apex: keep_batchnorm_fp32 and master_weights passed at O1", "amp/apex.py",
     "        if spec.cast_model:  # apex 25.05 refuses them at O1 (amp/frontend.py:72-89); O0 ignores them\n", "        if True:\n", ("tests/test_amp_apex.py",)),
)]


def mirrors(path: str, root: Path) -> list[str]:
    """The tests that mirror the mutated module (tests/test_<module>.py, tests/test_<package>.py,
    tests/test_<package>_<module>.py): the likeliest to kill it."""
    module = Path(path)
    names = {f"test_{module.stem}.py", f"test_{module.parent.name}.py", f"test_{module.parent.name}_{module.stem}.py"}
    return sorted(str(t.relative_to(root)) for t in (root / "tests").glob("test_*.py") if t.name in names)


def pytest(root: Path, timeout: float, markers: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # workers started as commands import the mutated copy too
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-m", markers, "-p", "no:cacheprovider",
                           "-o", "addopts=", *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)


def killer(proc: subprocess.CompletedProcess[str]) -> str:
    failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return failed[0].split()[1].split("[")[0].split(" - ")[0] if failed else "(collection)"


def stale(mutant: Mutant, root: Path = REPO) -> bool:
    return (root / mutant.path).read_text().count(mutant.old) != 1


def compiles(mutant: Mutant, root: Path = REPO) -> bool:
    """A mutant that breaks the syntax would be "killed" by every test that imports it: no evidence."""
    path = root / mutant.path
    try:
        compile(path.read_text().replace(mutant.old, mutant.new), str(path), "exec")
    except SyntaxError:
        return False
    return True


def run(mutant: Mutant, root: Path, timeout: float) -> tuple[str, float]:
    target = root / mutant.path
    original = target.read_text()
    if stale(mutant, root):
        return "stale", 0.0
    if not compiles(mutant, root):
        return "invalid: the mutated file does not compile", 0.0
    target.write_text(original.replace(mutant.old, mutant.new))
    started = time.monotonic()
    try:
        covering = sorted({*mirrors(mutant.path, root), *mutant.tests})
        proc = pytest(root, timeout, "not bench and not gpu", *covering) if covering else None
        if proc is None or proc.returncode == 0:
            proc = pytest(root, timeout, "not slow and not bench and not gpu", "-n", "2", "--dist", "loadgroup",
                          "--ignore", "tests/test_mutants.py")  # which finds the mutant's text missing
        verdict = "survived" if proc.returncode == 0 else f"killed by {killer(proc)}"
    except subprocess.TimeoutExpired:
        verdict = "killed (timeout)"
    finally:
        target.write_text(original)
    return verdict, time.monotonic() - started


def copy_repository(root: Path) -> None:
    """The working tree's files (tracked and untracked-not-ignored), where the mutants are applied one by one."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)


QUICK = "all_reduce bus factor (n-1)/n"  # --quick's one mutant: its mirror kills it in seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="names (substrings) of the mutants to run")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for one mutant's tests")
    args = common.parse_args(parser, argv)
    gone = [m.name for m in MUTANTS if stale(m)]
    chosen = [m for m in MUTANTS if m.name == QUICK] if args.quick else \
        [m for m in MUTANTS if not args.only or any(o in m.name for o in args.only)]
    settings = {"mutants": len(chosen), "OMP_NUM_THREADS": "the test suite's own (tests/conftest.py)"}
    common.print_settings("mutants", settings)
    table = common.Table("mutants: the tests that cover each, run against it", ["mutant", "where", "verdict", "s"])
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        root = Path(tmp) / "repo"
        copy_repository(root)
        for mutant in chosen:
            verdict, seconds = run(mutant, root, args.timeout)
            table.add(mutant.name, mutant.path, verdict, f"{seconds:.0f}")
            print(f"{mutant.name}: {verdict} ({seconds:.0f} s)", flush=True)
    table.print()
    survived = [row[0] for row in table.rows if not row[2].startswith("killed")]
    summary = (f"{len(chosen)} mutants, {len(chosen) - len(survived)} killed"
               + (f"; survived or stale: {', '.join(survived + gone)}" if survived or gone else "")
               + f"; {(time.monotonic() - began) / 60:.0f} min")
    print(summary, flush=True)
    if args.write_results:
        lines = [f"- {summary}.",
                 "- Each mutant ran the tests that cover its module (its mirrors and the tests it names, slow ones "
                 "included), then the fast suite only where those passed; the verdict names the first test that "
                 "failed."]
        common.write_results("mutants", common.results_page("mutants", settings, [table], lines),
                             args.results_dir)
    return 1 if survived or gone else 0


if __name__ == "__main__":
    sys.exit(main())
