"""Code a GPU runs as one fused kernel (a fused cross-entropy: Liger's, flash-attn's; CUDA's fused RMSNorm), marked
so that the planner's operator recorder (harness.prediction.gpu_model) times it as one: one launch, the bytes it reads
from memory made before it, what it writes over them, and the outputs it declares (`Kernel.writes`); what it makes
and drops inside stays on chip. Eager execution runs the marked code as the aten operators it is written in (the
numbers are the same); only the planner's timing reads the mark."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

_open: list[Kernel] = []  # a module global, not thread-local: autograd runs backward in a thread of its own


@dataclass
class Kernel:
    """One fused kernel (the recorder tells two of them apart by identity: two one after the other are two): its
    operator class (the planner's OPERATOR_CLASSES: a loss is a reduction, a normalisation a norm), and the bytes
    of the outputs it writes."""

    kind: str
    written: float = 0.0

    def writes(self, *tensors: torch.Tensor | None) -> None:
        """Outputs the kernel writes to memory (what it makes and keeps after it ends)."""
        self.written += sum(t.numel() * t.element_size() for t in tensors if t is not None)


@contextlib.contextmanager
def one_kernel(kind: str = "reduction") -> Iterator[Kernel]:
    """What runs inside is one kernel on a GPU, of the planner's operator class `kind`."""
    kernel = Kernel(kind)
    _open.append(kernel)
    try:
        yield kernel
    finally:
        _open.remove(kernel)


def current() -> Kernel | None:
    """The innermost open kernel, None outside one."""
    return _open[-1] if _open else None
