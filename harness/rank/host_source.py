"""A batch source that reads each batch on the host inside the training loop (a DataLoader's, a token file's):
the one place that says what counts as the loop's wait for data."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from harness.core.inputs import Batch


class HostSource(ABC):
    """Only the host read (`_load`) is counted as the loop's wait, not the copy to the device (`_to_device`): from
    pageable memory (pin_memory=false) a CUDA copy waits for everything queued on the stream before it, i.e. the
    previous iteration's kernels (compute, not data). `first()` reads the next batch ahead, before the clock, and
    the next `next()` hands it out."""

    def __init__(self) -> None:
        self._held: Batch | None = None
        self.waited = 0.0

    @abstractmethod
    def _load(self) -> Batch:
        """The next batch, read on the host."""

    @abstractmethod
    def _to_device(self, batch: Batch) -> Batch:
        """The batch where the model is."""

    def first(self) -> Batch:
        if self._held is None:
            self._held = self._to_device(self._load())
        return self._held

    def next(self) -> Batch:
        if self._held is not None:
            batch, self._held = self._held, None
            return batch
        start = time.perf_counter()
        host = self._load()
        self.waited += time.perf_counter() - start
        return self._to_device(host)

    def worker_pids(self) -> list[int]:
        return []
