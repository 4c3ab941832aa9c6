"""The peak of live tensor bytes in this process, as the CPU allocator reports them to torch's profiler.

On a GPU the caching allocator keeps its own peak (torch.cuda.max_memory_allocated); the CPU allocator
keeps none, so a rank's peak on CPU is read from the allocation and free events torch.profiler records with
`profile_memory=True` (each carries its signed size; c10's ProfiledCPUMemoryReporter emits them for every CPU
allocation while profiling is on). The running sum from the start of profiling is the bytes alive that
were allocated since; its maximum is the peak. This instrument sits below every Python-level tracker (the
predictor's fake tensors never reach it), so it checks predictions independently. It runs from before
the model is built to the end of the second iteration: warm-up, never a timed window."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

MEMORY_EVENT = "[memory]"


class TensorPeak:
    def __init__(self) -> None:
        self._profile: profile | None = None
        self.peak_bytes: int | None = None
        self.end_bytes: int | None = None

    def start(self) -> TensorPeak:
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
        self._profile.__enter__()
        return self

    def stop(self) -> int | None:
        """Stop profiling; the peak in bytes (None if never started or already read)."""
        if self._profile is None:
            return self.peak_bytes
        prof, self._profile = self._profile, None
        prof.__exit__(None, None, None)
        self.peak_bytes, self.end_bytes = peak_of(
            (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
            if e.name() == MEMORY_EVENT and e.device_type() == torch.autograd.DeviceType.CPU)
        return self.peak_bytes


def peak_of(events: object) -> tuple[int, int]:
    """(peak, final) of the running sum of signed sizes, in time order."""
    live = peak = 0
    for _, nbytes in sorted(events):  # type: ignore[call-overload]
        live += nbytes
        peak = max(peak, live)
    return peak, live
