"""What the trainer trains on: a batch source whose `next()` the loop calls once per iteration, and which
counts the seconds the loop spent waiting in it (host time, no device sync).

`data=synthetic` (default): a small pool of global batches made once, on the device, before the clock starts.
Every strategy trains on the same global batches in the same order: each is drawn from the run's seed on the
CPU (so the same whatever the device), and a process keeps its shard of it, consecutive slices by rank
(DataParallel, one process, keeps the whole batch and splits it itself). Cycling through several batches,
rather than one, keeps the loss curve informative (a single batch is memorised within a few windows); nothing
but an index into a list happens inside the timed loop. The task can be learnt: each image is its class's fixed
random pattern plus noise, so the loss falls over fresh batches as it would on real data, and amp levels can
be compared by it.

`data=loader`: a DataLoader that decodes and transforms images on the CPU every step, as real training does.
The global batch means the same: DistributedSampler shards every epoch's shuffled order, interleaved (rank r of
N takes positions r, r+N, r+2N, ... of it), and the k-th batches of the ranks together are the k-th global
batch a single process would read (DataParallel's one process reads the whole global batch). A sample's random
transforms are drawn from the run's seed, the epoch and the sample's index, not from the loader worker that
happens to load it, so one process and N crop every sample alike and parity can compare them."""

from __future__ import annotations

import functools
import hashlib
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any, Protocol

import torch

from harness.core.config import DataConfig
from harness.core.inputs import Batch, Inputs
from harness.rank.host_source import HostSource
from harness.rank.token_file import TokenFileSource


class BatchSource(Protocol):
    waited: float  # seconds the training loop spent in next(), so far

    def next(self) -> Batch: ...

    def first(self) -> Batch:
        """The batch the first next() will return, without taking it (compile=true's pass before the clock)."""
        ...
    def worker_pids(self) -> list[int]: ...

    def close(self) -> None: ...


def synthetic_batches(pool: int, global_batch: int, local_batch: int, shard: int, inputs: Inputs,
                      device: torch.device, seed: int,
                      memory_format: torch.memory_format = torch.contiguous_format) -> list[Batch]:
    """`pool` global batches the model can learn from (harness.core.inputs), drawn from `seed` on the CPU; this
    process keeps its shard of each, on its device (images in `memory_format`: channels_last when asked)."""
    start = shard * local_batch
    return [(_placed(x[start:start + local_batch], device, memory_format, copy=True),
             y[start:start + local_batch].to(device, copy=True))
            for x, y in inputs.batches(pool, global_batch, torch.Generator().manual_seed(seed))]


def _placed(x: torch.Tensor, device: torch.device, memory_format: torch.memory_format, **how: Any) -> torch.Tensor:
    """On the device, a batch of images (4-d) in `memory_format` when that is channels_last; any other input, or
    layout, as it is. `how`: the copy's own options (copy, non_blocking)."""
    if memory_format is torch.channels_last and x.dim() == 4:
        return x.to(device, memory_format=memory_format, **how)
    return x.to(device, **how)


class SyntheticSource:
    """Iteration `it` (from 1) trains on `batches[it % len(batches)]`."""

    def __init__(self, batches: list[Batch]) -> None:
        self._batches, self._count, self.waited = batches, 0, 0.0

    def next(self) -> Batch:
        start = time.perf_counter()
        self._count += 1
        batch = self._batches[self._count % len(self._batches)]
        self.waited += time.perf_counter() - start
        return batch

    def first(self) -> Batch:
        return self._batches[(self._count + 1) % len(self._batches)]
    def worker_pids(self) -> list[int]:
        return []

    def close(self) -> None:
        pass


class SlowDataset(torch.utils.data.Dataset):
    """`data.item_delay_ms`: every item takes this much longer, as from a slow disk or decoder."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.delay_s)
        return self.inner[index]


def image_dataset(data: DataConfig) -> torch.utils.data.Dataset:
    """PIL images through the usual training transforms; FakeData (no download) unless `root` is given."""
    import torchvision
    from torchvision import transforms

    transform = transforms.Compose([
        transforms.RandomResizedCrop(data.image_size), transforms.ToTensor(),
        transforms.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))])
    if data.root is not None:
        dataset: Any = torchvision.datasets.ImageFolder(data.root, transform=transform)
    else:
        dataset = torchvision.datasets.FakeData(size=data.size, image_size=(3, data.image_size, data.image_size),
                                                num_classes=data.num_classes, transform=transform)
    return SlowDataset(dataset, data.item_delay_ms / 1000) if data.item_delay_ms > 0 else dataset


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one sample's random transforms: a function of the sample, not of who loads it."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest(), "little")


class SampleSeeded(torch.utils.data.Dataset):
    """Items asked for as (epoch, index): each is loaded with torch's CPU generator seeded by `sample_seed`.
    Why: a DataLoader worker's generator is seeded per loader and worker id (base_seed + worker_id), so the
    same sample would otherwise get another crop in each process layout (torchvision's RandomResizedCrop
    draws from the global generator: `torch.empty(1).uniform_(scale[0], scale[1])`, `torch.randint(...)`)."""

    def __init__(self, inner: Any, seed: int) -> None:
        self.inner, self.seed = inner, seed

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        with torch.random.fork_rng(devices=[]):  # the worker's own generator is left as it was
            torch.manual_seed(sample_seed(self.seed, epoch, index))
            return self.inner[index]


class EpochTagged(torch.utils.data.Sampler):
    """A DistributedSampler's indices, each paired with its epoch (what `SampleSeeded` seeds by); iterated in
    the rank's own process, so persistent workers see every new epoch."""

    def __init__(self, inner: torch.utils.data.DistributedSampler) -> None:
        self.inner, self.epoch = inner, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.inner.set_epoch(epoch)

    def __iter__(self) -> Any:
        epoch = self.epoch
        return ((epoch, index) for index in self.inner)

    def __len__(self) -> int:
        return len(self.inner)


def note_pid(folder: Path, worker_id: int) -> None:
    """A DataLoader worker's first act: leave its PID where its rank will find it (the memory figures name
    the rank's workers by these, not by guessing from the process tree)."""
    (folder / str(os.getpid())).touch()


def sharded_loader(data: DataConfig, dataset: Any, local_batch: int, shards: int, shard: int, seed: int,
                   pid_dir: Path | None = None) -> tuple[torch.utils.data.DataLoader, EpochTagged]:
    """Shard `shard` of `shards` of every epoch's shuffled order, in batches of `local_batch`, each sample
    transformed with its own seed; each worker process notes its PID in `pid_dir`."""
    from torch.utils.data import DataLoader, DistributedSampler

    if len(dataset) < local_batch * shards:
        raise ValueError(f"data.root={data.root} holds {len(dataset)} images, fewer than one global batch "
                         f"({local_batch * shards})")
    sampler = EpochTagged(DistributedSampler(dataset, num_replicas=shards, rank=shard, shuffle=True, seed=seed,
                                             drop_last=True))
    workers = data.num_workers
    # Forked, as from a plain training script on Linux: a rank started by spawn would otherwise spawn its workers
    # too, and each would re-import the harness and torch (seconds each) before loading anything.
    context = "fork" if workers and "fork" in multiprocessing.get_all_start_methods() else None
    if pid_dir is not None:
        pid_dir.mkdir(parents=True, exist_ok=True)
    loader = DataLoader(SampleSeeded(dataset, seed), batch_size=local_batch, sampler=sampler, drop_last=True, num_workers=workers,
                        pin_memory=data.pin_memory, prefetch_factor=data.prefetch_factor if workers else None,
                        persistent_workers=data.persistent_workers and workers > 0, multiprocessing_context=context,
                        worker_init_fn=functools.partial(note_pid, pid_dir) if pid_dir is not None else None)
    return loader, sampler


class LoaderSource(HostSource):
    """Batches from a DataLoader, moved to the device; a new epoch (reshuffled) whenever one ends."""

    def __init__(self, loader: torch.utils.data.DataLoader, sampler: EpochTagged,
                 device: torch.device, pid_dir: Path | None = None,
                 memory_format: torch.memory_format = torch.contiguous_format) -> None:
        super().__init__()
        self._loader, self._sampler, self._device, self._pid_dir = loader, sampler, device, pid_dir
        self._memory_format = memory_format
        self._non_blocking = bool(loader.pin_memory) and device.type == "cuda"
        self._epoch = 0
        self._iterator: Any = iter(loader)  # workers start now, before the clock

    def _load(self) -> Batch:
        try:
            return next(self._iterator)
        except StopIteration:
            self._epoch += 1
            self._sampler.set_epoch(self._epoch)
            self._iterator = iter(self._loader)
            return next(self._iterator)

    def _to_device(self, batch: Batch) -> Batch:
        images, labels = batch
        return (_placed(images, self._device, self._memory_format, non_blocking=self._non_blocking),
                labels.to(self._device, non_blocking=self._non_blocking))

    def worker_pids(self) -> list[int]:
        """Every DataLoader worker this source started (new ones each epoch without persistent workers)."""
        if self._pid_dir is None or not self._pid_dir.is_dir():
            return []
        return sorted(int(p.name) for p in self._pid_dir.iterdir() if p.name.isdigit())

    def close(self) -> None:
        self._iterator = None  # its workers end with it (persistent ones when the loader is dropped)
        self._loader = None  # type: ignore[assignment]


def batch_source(data: DataConfig, inputs: Inputs, global_batch: int, shards: int, shard: int,
                 device: torch.device, seed: int, pid_dir: Path | None = None,
                 memory_format: torch.memory_format = torch.contiguous_format) -> BatchSource:
    """The run's data for shard `shard` of `shards` (one-process strategies: the one shard, the whole batch);
    DataLoader workers note their PIDs in `pid_dir`. data=loader reads images, data=tokens token ids (a model
    taking the other is refused before anything starts: harness.launch.decide)."""
    local_batch = global_batch // shards
    if data.name == "loader":
        loader, sampler = sharded_loader(data, image_dataset(data), local_batch, shards, shard, seed, pid_dir)
        return LoaderSource(loader, sampler, device, pid_dir, memory_format)
    if data.name == "tokens":
        return TokenFileSource(data, inputs.shape[0], global_batch, local_batch, shard, device, seed)
    return SyntheticSource(synthetic_batches(data.pool, global_batch, local_batch, shard, inputs, device, seed,
                                             memory_format))
