"""harness.collectives.arithmetic: nccl-tests' bandwidth arithmetic against hand-worked numbers, sizes."""

from __future__ import annotations

import pytest

from harness.collectives.arithmetic import (
    OPS,
    algbw,
    bus_factor,
    busbw,
    element_count,
    format_size,
    parse_size,
    size_ladder,
    table_rows,
)

MiB, GiB = 2**20, 2**30


# ---- bus bandwidth: every number below is worked out by hand ----

@pytest.mark.parametrize(("op", "n", "factor"), [
    ("all_reduce", 2, 1.0),  # 2(n-1)/n = 2*1/2
    ("all_reduce", 4, 1.5),  # 2*3/4
    ("all_reduce", 8, 1.75),  # 2*7/8
    ("all_gather", 2, 0.5),  # (n-1)/n
    ("all_gather", 8, 0.875),
    ("reduce_scatter", 4, 0.75),
    ("gather", 4, 0.75),
    ("scatter", 8, 0.875),
    ("broadcast", 8, 1.0),
    ("reduce", 8, 1.0),
    ("sendrecv", 8, 1.0),
    ("all_reduce", 1, 0.0),  # one rank: nothing crosses a link
])
def test_bus_factor(op, n, factor):
    assert bus_factor(op, n) == pytest.approx(factor)


def test_every_op_has_a_factor():
    assert {op: bus_factor(op, 2) for op in OPS}  # no ValueError
    with pytest.raises(ValueError):
        bus_factor("alltoall", 2)


def test_all_reduce_64MiB_in_10ms_on_4_ranks():
    # S = 67,108,864 B; algbw = S / 0.010 s = 6.7108864 GB/s; busbw = 6.7108864 * 2*3/4 = 10.0663296 GB/s
    assert algbw(64 * MiB, 0.010) == pytest.approx(6.7108864)
    assert busbw("all_reduce", 64 * MiB, 0.010, 4) == pytest.approx(10.0663296)


def test_all_gather_1GiB_total_in_100ms_on_8_ranks():
    # S is the total output (8 shares of 128 MiB): 1,073,741,824 B / 0.1 s = 10.73741824 GB/s; x 7/8 = 9.39524096
    assert algbw(GiB, 0.1) == pytest.approx(10.73741824)
    assert busbw("all_gather", GiB, 0.1, 8) == pytest.approx(9.39524096)


def test_reduce_scatter_8MiB_in_1ms_on_2_ranks():
    # 8,388,608 B / 0.001 s = 8.388608 GB/s; x 1/2 = 4.194304 GB/s
    assert busbw("reduce_scatter", 8 * MiB, 0.001, 2) == pytest.approx(4.194304)


def test_broadcast_and_reduce_bus_equals_algorithm_bandwidth():
    # 256 MiB = 268,435,456 B in 20 ms: 13.4217728 GB/s either way
    for op in ("broadcast", "reduce"):
        assert busbw(op, 256 * MiB, 0.020, 8) == algbw(256 * MiB, 0.020) == pytest.approx(13.4217728)


def test_sendrecv_matches_an_nccl_tests_line():
    # sendrecv_perf, 8 GPUs: "134217728 33554432 float sum -1 1211.2 110.81 110.81"
    assert algbw(134217728, 1211.2e-6) == pytest.approx(110.81, abs=0.005)
    assert busbw("sendrecv", 134217728, 1211.2e-6, 8) == pytest.approx(110.81, abs=0.005)


def test_gather_4MiB_total_in_2ms_on_4_ranks():
    # 4,194,304 B / 0.002 s = 2.097152 GB/s; x 3/4 = 1.572864 GB/s
    assert busbw("gather", 4 * MiB, 0.002, 4) == pytest.approx(1.572864)


# ---- sizes ----

@pytest.mark.parametrize(("text", "size"), [(4096, 4096), ("4096", 4096), ("4K", 4096), ("4KiB", 4096),
                                            ("4kb", 4096), ("64MiB", 64 * MiB), ("1G", GiB), ("256 MiB", 256 * MiB)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "4XB", "-4K", "4.5M", 0, True, "0K"])
def test_parse_size_refuses(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_size_ladder_4KiB_to_64MiB():
    sizes = size_ladder(4096, 64 * MiB, 2)
    assert len(sizes) == 15 and sizes[0] == 4096 and sizes[-1] == 64 * MiB
    assert size_ladder(4096, 64 * MiB, 4) == [4096 * 4**i for i in range(8)]
    assert size_ladder(4096, 5000, 2) == [4096]


def test_format_size():
    assert [format_size(s) for s in (4096, 64 * MiB, GiB, 1000)] == ["4 KiB", "64 MiB", "1 GiB", "1000 B"]


def test_element_count_total_buffer_split_evenly():
    assert element_count("all_reduce", 4100, 3, 4) == 1025
    assert element_count("all_gather", 4100, 3, 4) == 1023  # a multiple of the 3 ranks
    assert element_count("scatter", 4, 8, 4) == 8  # at least one element per rank
    assert element_count("broadcast", 2, 2, 4) == 1


def test_table_rows_use_the_median_of_the_slowest_rank_times():
    rows = table_rows([{"op": "all_reduce", "size_bytes": MiB, "count": MiB // 4, "seconds": [1e-3, 1e-3, 5e-3]},
                       {"op": "all_gather", "size_bytes": MiB, "count": MiB // 4, "seconds": [4e-3, 1e-3, 2e-3]}], 4)
    assert rows[0]["time_us"] == pytest.approx(1000.0) and rows[0]["time_us_max"] == pytest.approx(5000.0)
    assert rows[0]["busbw_gbs"] == pytest.approx(MiB / 1e-3 / 1e9 * 1.5)  # x 2(4-1)/4
    assert rows[1]["time_us"] == pytest.approx(2000.0) and rows[1]["bus_factor"] == pytest.approx(0.75)
    assert rows[1]["repeats"] == 3
    # beside the median, the mean a step of many calls pays: (1 + 1 + 5) / 3 ms, (4 + 1 + 2) / 3 ms
    assert (rows[0]["time_us_mean"], rows[1]["time_us_mean"]) == (pytest.approx(7000 / 3), pytest.approx(7000 / 3))
