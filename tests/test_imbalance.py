"""Memory-imbalance analysis on results files whose numbers are worked out by hand."""

from __future__ import annotations

import pytest

from harness.core.results import from_dict
from harness.memory import imbalance


def results(world_size, devices, peaks, baselines, processes, ranks):
    return from_dict({"schema": 2, "status": "ok", "strategy": "dp" if world_size == 1 else "ddp", "amp": "O0",
            "model": "resnet101",
            "world_size": world_size, "devices": devices, "ranks": ranks,
            "memory": {"source": "nvml",
                       "per_device": [{"device": d, "peak_mib": p, "baseline_mib": b}
                                      for d, p, b in zip(devices, peaks, baselines, strict=True)],
                       "per_process": processes}})


def test_dataparallel_base_gpu_excess_worked_by_hand(tmp_path):
    devices = ["cuda:0", "cuda:1", "cuda:3"]
    procs = [{"pid": 42, "rank": 0, "device": d, "peak_mib": 900.0, "role": "rank"} for d in devices]
    r = results(1, devices, [3000.0, 1500.0, 1600.0], [500.0, 500.0, 500.0], procs,
                [{"rank": 0, "device": "cuda:0"}])
    report = imbalance.analyze(r)
    # used: 2500, 1000, 1100; the others' mean 1050; excess 1450 MiB = 138.1 %; max/min 2.5
    assert [d["used_mib"] for d in report.devices] == [2500.0, 1000.0, 1100.0]
    assert report.base_device == "cuda:0"
    assert report.base_excess_mib == pytest.approx(1450.0)
    assert report.base_excess_pct == pytest.approx(138.095, abs=1e-3)
    assert report.max_min_ratio == pytest.approx(2.5)
    assert report.layout == "one PID (42) on every device"
    assert report.flags == []  # one process driving every GPU is DataParallel's layout, not a stray context
    assert "base cuda:0 uses 1.4 GiB (138%) more than the others" in report.verdict
    assert "DDP spreads memory evenly" in report.verdict
    md = imbalance.write(r, tmp_path)
    assert (tmp_path / "imbalance.md").read_text() == imbalance.to_markdown(r, md)
    assert "+1450.0 MiB (138.1%)" in (tmp_path / "imbalance.md").read_text()


def test_ddp_balanced_with_a_stray_context_flagged():
    devices = ["cuda:0", "cuda:1"]
    procs = [{"pid": 10, "rank": 0, "device": "cuda:0", "peak_mib": 1000.0, "role": "rank"},
             {"pid": 11, "rank": 1, "device": "cuda:1", "peak_mib": 1000.0, "role": "rank"},
             {"pid": 11, "rank": 1, "device": "cuda:0", "peak_mib": 300.0, "role": "rank"}]
    r = results(2, devices, [1350.0, 1000.0], [0.0, 0.0], procs,
                [{"rank": 0, "device": "cuda:0"}, {"rank": 1, "device": "cuda:1"}])
    report = imbalance.analyze(r)
    assert report.base_excess_pct == pytest.approx(35.0)
    assert len(report.flags) == 1
    assert "PID 11 (rank 1)" in report.flags[0] and "cuda:0" in report.flags[0] and "stray" in report.flags[0]
    assert report.layout == "2 PIDs over 2 devices"


def test_balanced_ddp_verdict():
    devices = ["cuda:0", "cuda:1"]
    procs = [{"pid": 10 + i, "rank": i, "device": d, "peak_mib": 1000.0, "role": "rank"}
             for i, d in enumerate(devices)]
    report = imbalance.analyze(results(2, devices, [1020.0, 1000.0], [0.0, 0.0], procs,
                                       [{"rank": i, "device": d} for i, d in enumerate(devices)]))
    assert report.layout == "one PID per device"
    assert report.verdict == "memory is balanced across devices (max/min 1.02)"


def test_one_device_and_missing_nvml():
    one = results(1, ["cuda:0"], [800.0], [100.0], [], [{"rank": 0, "device": "cuda:0"}])
    assert imbalance.analyze(one).verdict == "one device (cuda:0, 700 MiB): nothing to compare"
    missing = from_dict({"schema": 2, "status": "ok", "strategy": "ddp", "amp": "O0", "model": "m", "world_size": 2,
                         "memory": {"source": None, "per_device": [], "per_process": []}})
    report = imbalance.analyze(missing)
    assert report.base_excess_mib is None and "no per-device memory data" in report.verdict


def test_pid_of_another_process_is_flagged():
    devices = ["cuda:0", "cuda:1"]
    procs = [{"pid": 10, "rank": 0, "device": "cuda:0", "peak_mib": 1000.0, "role": "rank"},
             {"pid": 11, "rank": 1, "device": "cuda:1", "peak_mib": 1000.0, "role": "rank"},
             {"pid": 99, "rank": None, "device": "cuda:1", "peak_mib": 50.0, "role": "other"}]
    report = imbalance.analyze(results(2, devices, [1000.0, 1050.0], [0.0, 0.0], procs, []))
    assert any("PID 99" in f and "not part of this run" in f for f in report.flags)


def test_cpu_processes_get_a_process_verdict_never_a_gpu_one():
    """On CPU each "device" is a worker process's resident memory: no base GPU, no stray context."""
    devices = ["cpu:0", "cpu:1"]
    procs = [{"pid": 10 + i, "rank": i, "device": d, "peak_mib": 900.0, "role": "rank"} for i, d in enumerate(devices)]
    r = results(2, devices, [900.0, 600.0], [300.0, 300.0], procs, [{"rank": i, "device": d} for i, d in enumerate(devices)])
    r.memory.source = "psutil"
    report = imbalance.analyze(r)
    assert report.base_excess_pct == pytest.approx(100.0)  # grew 600 vs 300 MiB
    assert report.verdict.startswith("CPU worker processes grew by 300 MiB–600 MiB")
    assert "GPU" not in report.verdict.replace("not a GPU's", "") and "stray" not in report.verdict
    assert "DataParallel" not in report.verdict
