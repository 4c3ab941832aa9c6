"""Code a GPU runs as one fused kernel (a fused cross-entropy: Liger's, flash-attn's), marked so that the
planner's operator recorder (harness.plan.gpu_model) times it as one: one launch, the bytes it reads from memory
outside it and writes back there, its temporaries kept on chip. Eager execution runs the marked code as the
aten operators it is written in (the numbers are the same); only the planner's timing reads the mark."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_open = 0  # marks entered and not left (a module global: autograd runs backward in a thread of its own)
_generation = 0  # counts entries: two kernels one after the other are two


@contextlib.contextmanager
def one_kernel() -> Iterator[None]:
    """What runs inside is one kernel on a GPU."""
    global _open, _generation
    _open += 1
    _generation += 1
    try:
        yield
    finally:
        _open -= 1


def current() -> int | None:
    """The open kernel's number, None outside one."""
    return _generation if _open else None
