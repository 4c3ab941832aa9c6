"""The live-tensor peak on CPU (harness.memory.tensor_peak): hand-sized allocations whose peak, final bytes and
total allocated differ, so the instrument cannot pass by reporting the wrong one."""

from __future__ import annotations

import torch

from harness.memory.tensor_peak import TensorPeak, peak_of

MIB = 2**20


def test_peak_of_signed_sizes_in_time_order():
    # +3 at t=1, +2 at t=2 (5 live), -3 at t=3, +1 at t=4: peak 5, final 3, allocated 6
    assert peak_of([(4, 1), (1, 3), (3, -3), (2, 2)]) == (5, 3)


def test_the_probe_sees_the_peak_not_the_end_nor_the_sum():
    probe = TensorPeak().start()
    a = torch.empty(4 * MIB, dtype=torch.uint8)
    b = torch.empty(2 * MIB, dtype=torch.uint8)
    del a
    c = torch.empty(1 * MIB, dtype=torch.uint8)
    peak = probe.stop()
    assert peak is not None
    assert 6 * MIB <= peak < 6.1 * MIB  # a and b together; not 7 MiB (every allocation), not 3 MiB (the end)
    assert 3 * MIB <= probe.end_bytes < 3.1 * MIB
    del b, c


def test_tensors_alive_before_the_probe_are_not_counted():
    before = torch.empty(8 * MIB, dtype=torch.uint8)
    probe = TensorPeak().start()
    inside = torch.empty(1 * MIB, dtype=torch.uint8)
    peak = probe.stop()
    assert MIB <= peak < 1.1 * MIB
    del before, inside
