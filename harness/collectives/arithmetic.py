"""nccl-tests' arithmetic (pure functions): bus-bandwidth factors, sizes and element counts, the table rows.

Bandwidths follow NVIDIA nccl-tests (doc/PERFORMANCE.md; gather/scatter/sendrecv from their sources):
algbw = S / t and busbw = algbw x factor, where S is the size in bytes (for all_gather, reduce_scatter,
gather and scatter: the total buffer, every rank's share together) and the factor is 2(n-1)/n for
all_reduce, (n-1)/n for all_gather, reduce_scatter, gather and scatter, and 1 for broadcast, reduce and
send/recv. GB/s means 1e9 bytes per second.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather", "scatter", "sendrecv")
CHUNKED = ("all_gather", "reduce_scatter", "gather", "scatter")  # size = the total; each rank holds size/n
DTYPES = ("float32", "float16", "bfloat16", "float64")
GB = 1e9


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth for `n` ranks."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in CHUNKED:
        return (n - 1) / n
    if op in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {op}")


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: bytes moved per second as the caller sees them."""
    return size_bytes / seconds / GB


def busbw(op: str, size_bytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth in GB/s, comparable with the hardware's link speed whatever the rank count."""
    return algbw(size_bytes, seconds) * bus_factor(op, n)


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30}


def parse_size(value: int | str) -> int:
    """4096, '4K', '4KiB', '64MiB', '1G' -> bytes (binary units, as nccl-tests' -b/-e)."""
    if isinstance(value, bool):
        raise ValueError(f"{value} is not a size")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{value} is not a positive size")
        return value
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS or int(match.group(1)) < 1:
        raise ValueError(f"{value} is not a size such as 4096, 4KiB, 64MiB or 1GiB")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def format_size(size_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale} {unit}"
    return f"{size_bytes} B"


def size_ladder(min_size: int, max_size: int, factor: int) -> list[int]:
    """min_size, min_size*factor, ... up to max_size (included when the ladder reaches it)."""
    sizes, size = [], min_size
    while size <= max_size:
        sizes.append(size)
        size *= factor
    return sizes


def element_count(op: str, size_bytes: int, n: int, element_size: int) -> int:
    """Elements in the op's (total) buffer: whole elements, and for chunked ops a multiple of n."""
    count = max(1, size_bytes // element_size)
    if op in CHUNKED:
        count = max(n, count // n * n)
    return count



def table_row(m: Mapping[str, Any], n: int) -> dict[str, Any]:
    """One measured (op, size) as the table shows it: the median call, its spread and its bandwidths; the mean
    beside them (what a step of many calls pays on average: the planner's link is fitted to it)."""
    seconds = statistics.median(m["seconds"])
    return {"op": m["op"], "size_bytes": m["size_bytes"], "count": m["count"], "time_us": seconds * 1e6,
            "time_us_min": min(m["seconds"]) * 1e6, "time_us_max": max(m["seconds"]) * 1e6,
            "time_us_mean": statistics.fmean(m["seconds"]) * 1e6,
            "algbw_gbs": algbw(m["size_bytes"], seconds), "busbw_gbs": busbw(m["op"], m["size_bytes"], seconds, n),
            "bus_factor": bus_factor(m["op"], n), "repeats": len(m["seconds"])}


def table_rows(measured: Sequence[Mapping[str, Any]], n: int) -> list[dict[str, Any]]:
    return [table_row(m, n) for m in measured]

