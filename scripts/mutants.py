"""Mutation check of the figures the harness reports: apply each wrong-but-plausible change to a copy of the
repository, run the fast suite, and say whether a test caught it ("killed") or not ("survived").

    python scripts/mutants.py [--only NAME ...] [--jobs 1]

Each mutant is one textual replacement that must match exactly once; a mutant whose text is no longer in
the code is reported as "stale" (update the list with the code).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MUTANTS: list[tuple[str, str, str, str]] = [
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
     "return ((self.amp, self.impl, self.dtype, self.model, self.global_batch, self.image_size)",
     "return ((other.amp, other.impl, other.dtype, self.model, self.global_batch, self.image_size)"),
    ("memory: first repeat, not the median", "harness/memory/report.py",
     "row.mem_max_mib = statistics.median(maxima)", "row.mem_max_mib = maxima[0]"),
    ("a win with unknown spread", "harness/report/rows.py",
     "row.spread_known = level.known", "row.spread_known = True"),
    ("memory win ignores the spread", "harness/report/decision.py",
     "mem[0].mem_max_hi < mem[1].mem_max_lo", "mem[0].mem_max_mib < mem[1].mem_max_mib"),
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
     "if global_batch is not None and global_batch % world:", "if False:"),
    ("all_reduce bus factor (n-1)/n", "harness/collectives/arithmetic.py", "return 2 * (n - 1) / n", "return (n - 1) / n"),
    ("collective time: mean", "harness/collectives/arithmetic.py",
     'seconds = statistics.median(m["seconds"])', 'seconds = statistics.fmean(m["seconds"])'),
    # issues 16-18: the figures the newer strategies, parity and the breakdown report
    ("data wait share includes warm-up", "harness/core/timing.py",
     "    steady = steady_windows(windows)\n    seconds = sum(w.seconds for w in steady)\n    if not steady or seconds <= 0 or any(",
     "    steady = list(windows)\n    seconds = sum(w.seconds for w in steady)\n    if not steady or seconds <= 0 or any("),
    ("ZeRO's optimizer state not divided by the ranks", "harness/memory/footprint.py",
     '"optimizer_state": whole.optimizer_state / (world_size if state else 1)', '"optimizer_state": whole.optimizer_state'),
    ("parity: the first repeat's difference, not the largest", "harness/parity/report.py",
     "row.parity_max_rel = max(rel_diffs) if rel_diffs else None", "row.parity_max_rel = rel_diffs[0] if rel_diffs else None"),
    ("parity: losses not compared", "harness/parity/report.py",
     "loss_diffs.append(max(abs(a - b) for a, b in zip(ours, base, strict=False)))", "loss_diffs.append(0.0)"),
    ("compile time: the fastest rank's", "harness/launch/runner.py",
     "compile_seconds = max(compiled) if compiled else None", "compile_seconds = min(compiled) if compiled else None"),
    ("breakdown shares 10 % off", "harness/profile/breakdown.py",
     '"shares": {k: (v / span_s if span_s > 0 else None)', '"shares": {k: (v / (span_s * 1.1) if span_s > 0 else None)'),
]


def mirrors(path: str, root: Path) -> list[str]:
    """The tests that mirror the mutated module (tests/test_<module>.py, tests/test_<package>.py,
    tests/test_<package>_<module>.py): run first, alone, because they are the likeliest to kill it; the
    whole fast suite only if they do not."""
    module = Path(path)
    names = {f"test_{module.stem}.py", f"test_{module.parent.name}.py", f"test_{module.parent.name}_{module.stem}.py"}
    return sorted(str(t.relative_to(root)) for t in (root / "tests").glob("test_*.py") if t.name in names)


def pytest(root: Path, timeout: float, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # workers started as commands import the mutated copy too
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider",
                           "-o", "addopts=", *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)


def run(name: str, path: str, old: str, new: str, root: Path, timeout: float) -> tuple[str, float]:
    target = root / path
    original = target.read_text()
    if original.count(old) != 1:
        return "stale", 0.0
    target.write_text(original.replace(old, new))
    started = time.monotonic()
    try:
        first = mirrors(path, root)
        proc = pytest(root, timeout, *first) if first else None
        if proc is None or proc.returncode == 0:
            proc = pytest(root, timeout, "-n", "2", "--dist", "loadgroup")
        verdict = "survived" if proc.returncode == 0 else "killed"
        if verdict == "killed":
            failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
            verdict += f" by {failed[0].split()[1].split('[')[0] if failed else '(collection)'}"
    except subprocess.TimeoutExpired:
        verdict = "killed (timeout)"
    finally:
        target.write_text(original)
    return verdict, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="names (substrings) of the mutants to run")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        root = Path(tmp) / "repo"
        files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.split()
        for name in files:
            if (REPO / name).is_file():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, root / name)
        print("| mutant | where | verdict | s |\n|---|---|---|---:|", flush=True)
        survived = 0
        for name, path, old, new in MUTANTS:
            if args.only and not any(o in name for o in args.only):
                continue
            verdict, seconds = run(name, path, old, new, root, args.timeout)
            survived += verdict in ("survived", "stale")
            print(f"| {name} | {path} | {verdict} | {seconds:.0f} |", flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
