"""harness.collectives: nccl-tests' bandwidth arithmetic against hand-worked numbers, sizes, checks, outputs."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import REPO, describe

from harness.collectives import (
    OPS,
    CollectivesConfig,
    algbw,
    bus_factor,
    busbw,
    element_count,
    format_size,
    measure,
    parse_size,
    placement_for,
    size_ladder,
    table_rows,
    to_markdown,
    write_csv,
    write_plot,
)
from harness.errors import ConfigError
from harness.rank.devices import Hardware

MiB, GiB = 2**20, 2**30
NO_GPU = Hardware(visible_gpus=(), cores=2)
FOUR_GPUS = Hardware(visible_gpus=(0, 1, 2, 3), cores=16)


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


# ---- configuration and placement ----

def test_config_from_ladder_and_from_list():
    cfg = CollectivesConfig.from_dict({"min_size": "4KiB", "max_size": "16KiB", "factor": 2, "ops": ["all_reduce"]})
    assert cfg.sizes == (4096, 8192, 16384) and cfg.ops == ("all_reduce",)
    cfg = CollectivesConfig.from_dict({"sizes": ["1MiB", "4KiB"], "ops": list(OPS), "warmup": 0, "repeats": 1})
    assert cfg.sizes == (4096, MiB)


@pytest.mark.parametrize(("section", "key"), [
    ({"ops": ["all_reduce", "nope"]}, "collectives.ops"),
    ({"ops": []}, "collectives.ops"),
    ({"ops": ["all_reduce"], "sizes": ["4XB"]}, "collectives.sizes"),
    ({"ops": ["all_reduce"], "factor": 1}, "collectives.factor"),
    ({"ops": ["all_reduce"], "min_size": "1MiB", "max_size": "4KiB"}, "collectives.max_size"),
    ({"ops": ["all_reduce"], "dtype": "int8"}, "collectives.dtype"),
    ({"ops": ["all_reduce"], "repeats": 0}, "collectives.repeats"),
    ({"ops": ["all_reduce"], "warmup": -1}, "collectives.warmup"),
    ({"ops": ["all_reduce"], "typo": 1}, "collectives.typo"),
])
def test_config_refuses(section, key):
    with pytest.raises(ConfigError) as error:
        CollectivesConfig.from_dict(section)
    assert error.value.key == key


def test_placement_like_ddp():
    cpu = placement_for({"gpus": None, "nprocs": 2}, NO_GPU)
    assert cpu.accelerator == "cpu" and cpu.world_size == 2 and cpu.devices == ("cpu:0", "cpu:1")
    gpu = placement_for({"gpus": [1, 3], "nprocs": 2}, FOUR_GPUS)
    assert gpu.accelerator == "cuda" and gpu.devices == ("cuda:1", "cuda:3")
    assert gpu.worker_env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert placement_for({"gpus": None, "nprocs": 2}, FOUR_GPUS).world_size == 4
    assert placement_for({"gpus": [], "nprocs": 3}, FOUR_GPUS).devices == ("cpu:0", "cpu:1", "cpu:2")
    with pytest.raises(ConfigError, match="gpus"):
        placement_for({"gpus": [7], "nprocs": 2}, FOUR_GPUS)
    with pytest.raises(ConfigError, match="dist.timeout_s"):
        placement_for({"gpus": None, "nprocs": 2, "dist": {"timeout_s": 0}}, NO_GPU)


# ---- the table and the plot, from made-up timings ----

FAKE = [{"op": "all_reduce", "size_bytes": 4096, "count": 1024, "seconds": [1e-4, 2e-4, 3e-4]},
        {"op": "all_reduce", "size_bytes": MiB, "count": MiB // 4, "seconds": [1e-3, 1e-3, 5e-3]},
        {"op": "all_gather", "size_bytes": MiB, "count": MiB // 4, "seconds": [2e-3]}]
HEADER = {"backend": "gloo", "world_size": 2, "devices": ["cpu:0", "cpu:1"], "dtype": "float32", "warmup": 1,
          "repeats": 3}


def test_table_uses_the_median(tmp_path):
    rows = table_rows(FAKE, 2)
    assert rows[0]["time_us"] == pytest.approx(200.0)  # median of 100, 200, 300 µs
    assert rows[1]["algbw_gbs"] == pytest.approx(MiB / 1e-3 / 1e9)  # 1.048576 GB/s
    assert rows[1]["busbw_gbs"] == pytest.approx(1.048576)  # x 2(2-1)/2 = 1
    assert rows[2]["busbw_gbs"] == pytest.approx(MiB / 2e-3 / 1e9 / 2)  # x (2-1)/2
    markdown = to_markdown(rows, HEADER, {"reduce_scatter": "at 4 KiB: RuntimeError: not supported"})
    assert "| all_reduce | 1 MiB | 1048576 | 1000.0 |" in markdown
    assert "| reduce_scatter | — |" in markdown and "not measured at 4 KiB: RuntimeError" in markdown
    write_csv(rows, tmp_path / "t.csv")
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0].startswith("op,size,size_bytes") and len(lines) == 4
    png = write_plot(rows, HEADER, tmp_path / "bandwidth.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_measure_in_process_records_what_cannot_run(monkeypatch):
    """A one-rank gloo group in this process: every op is timed, send/recv (needs a peer) is recorded
    as not measured instead of failing the benchmark."""
    import socket

    from strategies.base import ProcessGroupStrategy, RankEnv

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    placement = placement_for({"gpus": [], "nprocs": 1}, NO_GPU)
    group = ProcessGroupStrategy()
    group.setup(RankEnv(0, 0, 1, placement, timeout_s=30))
    try:
        cfg = CollectivesConfig.from_dict({"ops": list(OPS), "sizes": [4096], "warmup": 1, "repeats": 2})
        measured, unsupported = measure(cfg, group, rank=0, n=1)
    finally:
        group.teardown()
    assert [m["op"] for m in measured] == [op for op in OPS if op != "sendrecv"]
    assert all(len(m["seconds"]) == 2 and m["size_bytes"] == 4096 for m in measured)
    assert list(unsupported) == ["sendrecv"] and "at least 2 ranks" in unsupported["sendrecv"]


# ---- the real thing: 2 gloo workers, tiny sizes ----

@pytest.mark.slow
def test_benchmark_runs_with_two_workers(tmp_path):
    out = tmp_path / "coll"
    proc = subprocess.run([sys.executable, "-m", "harness.collectives", "nprocs=2", "gpus=[]",
                           "collectives.sizes=[4KiB,64KiB]", "collectives.warmup=1", "collectives.repeats=2",
                           f"hydra.run.dir={out}"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, describe(proc)
    results = json.loads((out / "collectives.json").read_text())
    assert results["status"] == "ok" and results["world_size"] == 2 and results["backend"] == "gloo"
    measured = {r["op"] for r in results["rows"]} | set(results["unsupported"])
    assert measured == set(OPS), results["unsupported"]
    for row in results["rows"]:
        assert row["size_bytes"] in (4096, 65536) and row["time_us"] > 0
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * bus_factor(row["op"], 2))
    table = (out / "collectives.md").read_text()
    assert "| all_reduce | 4 KiB | 4096 |" in table and "| sendrecv | 64 KiB | 65536 |" in table
    assert (out / "collectives.csv").read_text().startswith("op,size,")
    assert (out / "bandwidth.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / "results.json").exists()  # the strategy report must not mistake it for a run


@pytest.mark.slow
def test_one_rank_out_of_memory_stops_that_op_on_every_rank_without_a_hang(tmp_path):
    """Rank 1 alone runs out of memory at 64 KiB. Before: rank 1 went on to the next op while rank 0 ran
    the 64 KiB all_reduce, and both waited in different collectives until the timeout (120 s)."""
    out = tmp_path / "coll"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness.collectives", "nprocs=2", "gpus=[]",
                           "collectives.sizes=[4KiB,64KiB,256KiB]", "collectives.ops=[all_reduce,broadcast]",
                           "collectives.warmup=1", "collectives.repeats=2", "collectives.fault.rank=1",
                           "collectives.fault.size=64KiB", "dist.timeout_s=120", f"hydra.run.dir={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    assert proc.returncode == 0, describe(proc)
    assert took < 100, f"took {took:.0f} s: the ranks waited for each other until the collective timeout"
    results = json.loads((out / "collectives.json").read_text())
    for op in ("all_reduce", "broadcast"):
        assert [r["size_bytes"] for r in results["rows"] if r["op"] == op] == [4096]
        reason = results["unsupported"][op]
        assert reason.startswith("at 64 KiB: rank 1: OutOfMemoryError: injected fault"), reason


@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "coll"
    proc = subprocess.run([sys.executable, "-m", "harness.collectives", "collectives.ops=[all_reduce,nope]",
                           f"hydra.run.dir={out}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip().splitlines()[-1].startswith("error: collectives.ops=[all_reduce,nope] is not allowed")
    assert not out.exists()
