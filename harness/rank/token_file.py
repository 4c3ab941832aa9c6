"""`data=tokens`: a language model trained on real token ids read from a local file, as nanoGPT's `get_batch`
reads its `train.bin`: each sample is a window of `seq_len + 1` consecutive tokens at a random offset, the
first `seq_len` in and the last `seq_len` (shifted by one) as the next-token targets.

The file is a flat array of token ids: `.npy` (its dtype is in its header) or raw binary of `data.token_dtype`
(nanoGPT's prepare.py writes uint16). It is memory-mapped, never loaded whole. The offsets of global batch k
are drawn from the run's seed, the same on every rank, and a process keeps its consecutive slice by rank (as
data=synthetic does): every strategy and layout trains on the same global batches in the same order, so parity
holds. Reading happens in the loop, counted as the loop's wait for data (data_wait_s); the copy to the device is
not (harness.rank.host_source says why)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from harness.core.config import DataConfig
from harness.core.errors import ConfigError
from harness.core.inputs import Batch, Inputs
from harness.rank.host_source import HostSource

SCAN_CHUNK = 1 << 24  # token ids checked per step of the parent's scan for ids beyond the vocabulary


def open_tokens(data: DataConfig) -> np.ndarray:
    """The file's token ids, memory-mapped: `.npy` with the dtype it records, anything else raw `token_dtype`."""
    path = Path(str(data.file))
    if path.suffix == ".npy":
        array = np.load(path, mmap_mode="r")
        return array.reshape(-1)
    return np.memmap(path, dtype=np.dtype(data.token_dtype), mode="r")


def check_token_file(data: DataConfig, inputs: Inputs) -> int:
    """In the parent, before anything starts: the file opens, holds at least one sample's window, and every id
    is a token of the model's vocabulary (an id beyond it would fail in the embedding, inside a worker).
    Returns the number of tokens."""
    key = "data.file"
    try:
        ids = open_tokens(data)
    except (OSError, ValueError) as error:
        raise ConfigError(key, data.file, f"a readable file of token ids, .npy or raw {data.token_dtype} "
                          f"(data.token_dtype) ({error})") from None
    if ids.dtype.kind not in "iu":
        raise ConfigError(key, data.file, f"integer token ids; this file holds {ids.dtype}")
    window = inputs.shape[0] + 1
    if ids.size < window:
        raise ConfigError(key, data.file, f"at least model.seq_len + 1 = {window} tokens; it holds {ids.size}")
    for start in range(0, ids.size, SCAN_CHUNK):
        chunk = ids[start:start + SCAN_CHUNK]
        low, high = int(chunk.min()), int(chunk.max())
        if low < 0 or high >= inputs.classes:
            bad = low if low < 0 else high
            raise ConfigError(key, data.file, f"token ids below model.vocab_size ({inputs.classes}); it holds {bad} "
                              f"(raise model.vocab_size, or check data.token_dtype={data.token_dtype})")
    return int(ids.size)


class TokenFileSource(HostSource):
    """Global batch k (k = 1, 2, ...): `global_batch` windows at offsets drawn from the seed's generator, of
    which this process keeps samples [shard * local_batch, (shard + 1) * local_batch)."""

    def __init__(self, data: DataConfig, seq_len: int, global_batch: int, local_batch: int, shard: int,
                 device: torch.device, seed: int) -> None:
        super().__init__()
        self._ids = open_tokens(data)
        self._seq_len, self._global, self._device = seq_len, global_batch, device
        self._slice = slice(shard * local_batch, (shard + 1) * local_batch)
        self._generator = torch.Generator().manual_seed(seed)

    def _load(self) -> Batch:
        """The next global batch's offsets (drawn whole, on every rank alike), this process's windows read."""
        offsets = torch.randint(0, self._ids.size - self._seq_len, (self._global,), generator=self._generator)
        windows = np.stack([self._ids[o:o + self._seq_len + 1] for o in offsets[self._slice].tolist()])
        sequence = torch.from_numpy(windows.astype(np.int64))
        return sequence[:, :-1].contiguous(), sequence[:, 1:].contiguous()

    def _to_device(self, batch: Batch) -> Batch:
        return batch[0].to(self._device), batch[1].to(self._device)

    def close(self) -> None:
        self._ids = None  # type: ignore[assignment]  # the memory map is released with it
