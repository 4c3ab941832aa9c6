"""harness.rank.data: every strategy sees the same global batches; ranks hold consecutive shards of them.
data=loader: its options checked before anything starts, the global batch meaning the same for every
strategy, the wait per window counted, and a slow dataset showing up as a larger data-wait share."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TINY, config_dict, describe, run_cli

from harness.core.config import DataConfig, RunConfig
from harness.core.errors import ConfigError
from harness.core.inputs import images as image_inputs
from harness.core.timing import Window, WindowClock, data_wait_share, merge_ranks, steady_throughput
from harness.rank.data import LoaderSource, SyntheticSource, sharded_loader, synthetic_batches

CPU = torch.device("cpu")


def test_the_ranks_shards_make_the_one_process_global_batch_in_order():
    whole = synthetic_batches(3, 8, 8, 0, image_inputs(4, 10), CPU, 5)
    shards = [synthetic_batches(3, 8, 2, rank, image_inputs(4, 10), CPU, 5) for rank in range(4)]
    for k in range(3):
        assert torch.equal(torch.cat([s[k][0] for s in shards]), whole[k][0])
        assert torch.equal(torch.cat([s[k][1] for s in shards]), whole[k][1])
        assert shards[1][k][0].shape == (2, 3, 4, 4)


def test_the_pool_holds_distinct_batches_fixed_by_the_seed():
    pool = synthetic_batches(4, 6, 6, 0, image_inputs(4, 10), CPU, 1)
    assert not torch.equal(pool[0][0], pool[1][0])
    again = synthetic_batches(4, 6, 6, 0, image_inputs(4, 10), CPU, 1)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(pool, again, strict=True))
    other = synthetic_batches(1, 6, 6, 0, image_inputs(4, 10), CPU, 2)
    assert not torch.equal(other[0][0], pool[0][0])


def test_each_image_is_its_class_pattern_plus_noise_so_the_task_can_be_learnt():
    (images, labels), = synthetic_batches(1, 400, 400, 0, image_inputs(4, 2), CPU, 3)
    first, second = images[labels == 0].mean(0), images[labels == 1].mean(0)
    assert (first - second).abs().mean() > 0.5  # the classes differ by more than the noise averages to


LOADER = {"name": "loader", "image_size": 8, "num_classes": 10}


@pytest.mark.parametrize("data, extra, key", [
    ({"name": "synthetic", "image_size": 8, "num_classes": 10, "num_workers": 2}, {}, "data.num_workers"),
    ({**LOADER, "pool": 4}, {}, "data.pool"),  # a synthetic-only key: it would be silently ignored
    ({**LOADER, "num_workers": -1}, {}, "data.num_workers"),
    ({**LOADER, "item_delay_ms": -3}, {}, "data.item_delay_ms"),
    ({**LOADER, "size": 4}, {}, "data.size"),  # fewer images than one global batch (12)
    ({**LOADER, "root": "/no/such/folder"}, {}, "data.root"),
    ({**LOADER, "name": "disk"}, {}, "data.name"),
    (LOADER, {"profile": "yes"}, "profile"),
    (LOADER, {"profile": True, "warmup_windows": 0}, "warmup_windows"),
    (LOADER, {"profile": True, "iterations": 40}, "iterations"),  # 2 windows of 20: none steady besides the profiled
])
def test_bad_data_and_profile_settings_are_refused(data, extra, key):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(config_dict(data=data, **extra), "single")
    assert info.value.key == key and "\n" not in str(info.value)


def test_good_loader_settings_are_kept():
    cfg = RunConfig.from_dict(config_dict(data={**LOADER, "num_workers": 0, "item_delay_ms": 2}, profile=True,
                                          iterations=60), "single")
    assert cfg.data.num_workers == 0 and cfg.data.item_delay_ms == 2 and cfg.profile is True


class Indexed(torch.utils.data.Dataset):
    """Item i is (a 1-pixel image, label i): batches say which items they hold."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(3, 1, 1), index


def items(source: LoaderSource, batches: int) -> list[list[int]]:
    return [source.next()[1].tolist() for _ in range(batches)]


def test_the_ranks_kth_batches_together_are_the_single_processs_kth_global_batch():
    """Global batch 12 over 4 ranks (3 each) against one process reading 12 at a time, across an epoch boundary
    (48 items: 4 global batches an epoch; the 5th and 6th come from epoch 1, reshuffled)."""
    data = DataConfig(**LOADER, num_workers=0)
    whole = items(LoaderSource(*sharded_loader(data, Indexed(), 12, 1, 0, seed=3), torch.device("cpu")), 6)
    shards = [items(LoaderSource(*sharded_loader(data, Indexed(), 3, 4, r, seed=3), torch.device("cpu")), 6)
              for r in range(4)]
    for k in range(6):
        together = sorted(i for shard in shards for i in shard[k])
        assert together == sorted(whole[k]), k
        assert len(set(together)) == 12
    assert sorted(i for k in range(4) for i in whole[k]) == list(range(48))  # an epoch reads every item once
    assert whole[4] != whole[0]  # epoch 1 is reshuffled (set_epoch), not epoch 0 again
    other_seed = items(LoaderSource(*sharded_loader(data, Indexed(), 12, 1, 0, seed=4), torch.device("cpu")), 1)
    assert other_seed[0] != whole[0]


class Drawn(Indexed):
    """Item i is (a random draw from torch's generator, as RandomResizedCrop draws its crop; label i)."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.rand(1), index


def draws(source: LoaderSource, batches: int) -> list[dict[int, float]]:
    """Per batch: item -> its draw."""
    out = []
    for _ in range(batches):
        values, labels = source.next()
        out.append(dict(zip(labels.tolist(), values.view(-1).tolist(), strict=True)))
    return out


@pytest.mark.slow
def test_a_samples_random_transform_is_the_same_in_one_process_and_in_four():
    """The crop of a sample depends on the sample (seed, epoch, index), not on which loader or worker loads
    it: one process with 2 workers and 4 ranks without workers draw the same for every item; a new epoch
    draws anew (augmentation still varies between epochs)."""
    whole = draws(LoaderSource(*sharded_loader(DataConfig(**LOADER, num_workers=2), Drawn(), 12, 1, 0, seed=3),
                               torch.device("cpu")), 6)
    shards = [draws(LoaderSource(*sharded_loader(DataConfig(**LOADER, num_workers=0), Drawn(), 3, 4, r, seed=3),
                                 torch.device("cpu")), 6) for r in range(4)]
    for k in range(6):
        assert {i: v for shard in shards for i, v in shard[k].items()} == whole[k], k
    epoch0 = {i: v for k in range(4) for i, v in whole[k].items()}
    assert all(epoch0[i] != v for k in (4, 5) for i, v in whole[k].items())  # epoch 1: new draws
    assert len(set(epoch0.values())) == 48  # and each sample its own


def test_clock_counts_the_wait_per_window_and_marks_the_profiled_window():
    waited, now = [0.0], [0.0]
    clock = WindowClock(lambda: None, warmup_windows=1, clock=lambda: now[0], data_wait=lambda: waited[0],
                        profiled_window=1, unix=lambda: 1000.0 + now[0])
    clock.start()
    for seconds, wait in ((2.0, 1.5), (1.0, 0.25), (1.0, 0.5), (1.0, 0.0)):
        now[0] += seconds
        waited[0] += wait
        clock.edge(len(clock.windows) + 1)
    assert [w.data_wait_s for w in clock.windows] == [1.5, 0.25, 0.5, 0.0]
    assert [w.profiled for w in clock.windows] == [False, True, False, False]
    assert clock.spans == [(1000.0, 1002.0), (1002.0, 1003.0), (1003.0, 1004.0), (1004.0, 1005.0)]
    # steady = windows 3 and 4 (warm-up and profiled left out): 0.5 s of waiting in 2 s
    assert data_wait_share(clock.windows) == pytest.approx(0.25)
    assert steady_throughput(clock.windows, global_batch=10, log_every=1) == pytest.approx(10.0)


def test_the_runs_wait_is_the_longest_any_rank_waited():
    rank0 = [Window(1, 1.0, 1.0, True, data_wait_s=0.1), Window(2, 1.0, 2.0, False, data_wait_s=0.3, profiled=True)]
    rank1 = [Window(1, 1.1, 1.1, True, data_wait_s=0.4), Window(2, 1.0, 2.1, False, data_wait_s=0.2, profiled=True)]
    merged = merge_ranks([rank0, rank1], warmup_windows=1)
    assert [w.data_wait_s for w in merged] == [0.4, 0.3] and merged[1].profiled


@pytest.mark.slow
def test_dataloader_workers_note_their_pids_for_the_memory_figures(tmp_path):
    import os

    data = DataConfig(**LOADER, num_workers=2, persistent_workers=False)
    source = LoaderSource(*sharded_loader(data, Indexed(), 12, 1, 0, seed=0, pid_dir=tmp_path / "pids"),
                          torch.device("cpu"), tmp_path / "pids")
    items(source, 6)  # 4 batches an epoch: the 5th and 6th come from a new epoch's two new workers (not persistent)
    pids = source.worker_pids()
    source.close()
    assert len(pids) == 4 and os.getpid() not in pids


def test_synthetic_source_keeps_the_pool_order_and_counts_its_wait():
    pool = [(torch.full((1,), float(i)), torch.tensor([i])) for i in range(3)]
    source = SyntheticSource(pool)
    assert [int(source.next()[1]) for _ in range(4)] == [1, 2, 0, 1]  # iteration it trains on pool[it % 3]
    assert 0 < source.waited < 0.01


# ---- a real run: the slower the dataset, the larger the share of the window spent waiting for it ------------

DELAY_MS = 40.0
SLOW = ("strategy=single", *TINY, "data=loader", "data.num_workers=0", "iterations=15", "log_every=5")


@pytest.fixture(scope="module")
def fast_and_slow(tmp_path_factory):
    """Two runs in the launcher (strategy=single), the slow one profiled; each with its terminal output (`_said`),
    run without KINETO_LOG_LEVEL, as a user's shell has it."""
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    runs = {}
    for name, extra in (("fast", ()), ("slow", (f"data.item_delay_ms={DELAY_MS}", "profile=true"))):
        proc, r = run_cli(*SLOW, *extra, tmp_path=tmp_path_factory.mktemp(name), env=env, one_core=True)
        assert r is not None and r["status"] == "ok", describe(proc)
        runs[name] = {**r, "_said": proc.stdout + proc.stderr}
    return runs


KINETO_NOISE = ("gpuGetDeviceCount", "USDT", "profiler_start", "profiler_stop")


@pytest.mark.xdist_group("data_runs")  # one worker starts the two runs
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="kineto's lines about a missing GPU: a CPU-only machine's")
def test_a_profiled_cpu_run_in_the_launcher_keeps_kinetos_lines_off_the_terminal(fast_and_slow):
    """Issue 53: a CPU run inside the launcher (strategy=single) printed kineto's C++ lines on the terminal, `ERROR:
    ... gpuGetDeviceCount failed with code 35` and `USDT: ... profiler_start` / `profiler_stop`, from the tensor
    peak's profiler and profile=true's (the slow run has both); the profile and the peak are still measured."""
    for r in fast_and_slow.values():
        said = [line for line in r["_said"].splitlines() if any(n in line for n in KINETO_NOISE)]
        assert not said, said
        assert [e["tensor_peak_mib"] > 0 for e in r["ranks"]] == [True]
    slow = fast_and_slow["slow"]
    assert slow["profile"]["traces"] == ["traces/rank0.json"]
    assert (Path(slow["_run_dir"]) / "traces" / "rank0.json").is_file()


@pytest.mark.xdist_group("data_runs")  # one worker starts the two runs
@pytest.mark.slow
def test_a_slow_dataset_raises_the_data_wait_share(fast_and_slow):
    fast, slow = fast_and_slow["fast"], fast_and_slow["slow"]
    # in the loop (num_workers=0), every image sleeps DELAY_MS: each window of 5 iterations of 8 images waits at
    # least 1.6 s (a bound that holds on any machine, loaded or not; the decoding itself varies with the load)
    floor = 5 * 8 * DELAY_MS / 1000
    assert all(w["data_wait_s"] >= floor for w in slow["windows"])
    assert all(w["data_wait_s"] < floor for w in fast["windows"])
    steady_fast = [w for w in fast["windows"] if not w["warmup"] and not w["profiled"]]
    steady_slow = [w for w in slow["windows"] if not w["warmup"] and not w["profiled"]]
    assert slow["data_wait_share"] == pytest.approx(sum(w["data_wait_s"] for w in steady_slow)
                                                    / sum(w["seconds"] for w in steady_slow))
    assert fast["data_wait_share"] == pytest.approx(sum(w["data_wait_s"] for w in steady_fast)
                                                    / sum(w["seconds"] for w in steady_fast))
    # The share rose with the sleep: with 1.6 s of sleep per window it falls below half only past 320 ms of other
    # work per tiny iteration. Not slow share > fast share: the tiny model's own data and compute time vary
    # several-fold with the suite's load between the two runs (a loaded moment once gave the slow run 0.64
    # against the fast run's 0.72); the sleep, counted above in every window, does not.
    assert slow["data_wait_share"] > 0.5  # 1.6 s of sleep per window: below half only past 320 ms per iteration
    for w in slow["windows"]:
        assert w["data_wait_s"] <= w["seconds"]
    # the profiler's view agrees with the loop's own clock on the profiled window
    profiled = next(w for w in slow["windows"] if w["profiled"])
    run = slow["profile"]["run"]
    assert run["shares"]["data_wait"] == pytest.approx(profiled["data_wait_s"] / profiled["seconds"], abs=0.05)


# ---- pin_memory=false on a GPU: the copy waits for the previous iteration's kernels, which are not data wait ----

LOAD_S, QUEUED_S = 0.01, 0.1  # the loader's time per batch; the GPU work still queued when the copy starts


class PageableBatchPart:
    """A host tensor in pageable memory (pin_memory=false) as a CUDA copy treats it: `.to(cuda)` returns only
    once the stream has run everything queued before the copy. It imitates torch's non-blocking=False copy,
    at::cuda::memcpy_and_sync (torch/include/c10/cuda/CUDAFunctions.h), which ends with
        C10_CUDA_CHECK(cudaStreamSynchronize(stream));
    (and a `non_blocking=True` copy from pageable memory is staged synchronously just the same)."""

    def __init__(self, copies: list[tuple[str, bool]]) -> None:
        self.copies = copies

    def to(self, device: torch.device, non_blocking: bool = False) -> str:
        time.sleep(QUEUED_S)  # the previous iteration's backward and optimizer step finishing on the GPU
        self.copies.append((str(device), non_blocking))
        return f"on {device}"


class FakeLoader:
    """What LoaderSource reads of a DataLoader: its pin_memory and batches, each LOAD_S in coming."""

    pin_memory = False

    def __init__(self) -> None:
        self.copies: list[tuple[str, bool]] = []

    def __iter__(self) -> Any:
        while True:
            time.sleep(LOAD_S)
            yield PageableBatchPart(self.copies), PageableBatchPart(self.copies)


def test_the_copy_to_the_gpu_is_not_counted_as_data_wait():
    """3 batches: the loop waited 3 x 10 ms for the loader; the copies' 6 x 100 ms are the GPU finishing the
    previous iterations (counted as data wait they would make it 0.63 s, data-bound on a compute-bound run)."""
    loader = FakeLoader()
    source = LoaderSource(loader, None, torch.device("cuda", 0))  # type: ignore[arg-type]
    batches = [source.next() for _ in range(3)]
    assert batches == [("on cuda:0", "on cuda:0")] * 3
    assert loader.copies == [("cuda:0", False)] * 6  # pageable memory: a blocking copy
    assert 3 * LOAD_S <= source.waited < 3 * LOAD_S + QUEUED_S, source.waited
