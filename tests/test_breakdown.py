"""harness.profile.breakdown: profiled windows partitioned by hand-made traces whose answers are worked out by hand,
in torch.profiler's Chrome-trace format (ph "X", ts/dur in microseconds, cat cpu_op / user_annotation / kernel /
cuda_runtime, args.correlation linking a kernel to its launch)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import leave_at_once, start_ranks

from harness.core.rank_record import RankRecord
from harness.core.timing import Window
from harness.profile.breakdown import breakdown, breakdown_of_events, host_kind, runs_operator
from harness.profile.merge import profile_section

MAIN, GLOO = 100, 200


def ev(name: str, ts: float, dur: float, tid: int = MAIN, cat: str = "cpu_op", **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "args": args}


def span(ts: float = 0.0, dur: float = 100.0) -> dict:
    return ev("harness.window", ts, dur, cat="user_annotation")


def test_names_torch_gives_are_classified():
    assert host_kind("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__") == "data"
    assert host_kind("Optimizer.step#SGD.step") == "optimizer"
    assert host_kind("Optimizer.zero_grad#SGD.zero_grad") == "optimizer"
    assert host_kind("aten::_pin_memory") == "data"  # the DataLoader's pinning thread: not training compute
    for comm in ("gloo:all_reduce", "c10d::allreduce_", "nccl:all_reduce", "record_param_comms", "Broadcast",
                 "autograd::engine::evaluate_function: ReduceAddCoalescedBackward", "Gather", "Scatter"):
        assert host_kind(comm) == "comm", comm
    for compute in ("aten::convolution", "DistributedDataParallel.forward", "aten::gather", "aten::scatter_add_",
                    "autograd::engine::evaluate_function: ConvolutionBackward0"):
        assert host_kind(compute) == "compute", compute


# A CPU DDP-like window, 100 µs:
#   0-20  DataLoader next                                                    -> data wait 20
#   20-50 DistributedDataParallel.forward, a scope: the conv 21-29 runs       -> compute 8
#         inside it a broadcast 30-35                                        -> communication 5
#         20-21, 29-30, 35-45 in the scope with no operator, nothing in flight -> other 12
#         45-50 in the scope with no operator, gloo's all-reduce in flight   -> communication 5 (a wait)
#   50-60 the training thread in no op, the all-reduce (45-70, gloo's own thread) in flight -> communication 10
#   60-80 an op while the all-reduce finishes   -> compute 20 (10 of them overlapping the all-reduce)
#   80-90 optimizer step                        -> optimizer 10
#   90-100 nothing                              -> other 10
CPU_WINDOW = [span(), ev("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 20, cat="user_annotation"),
              ev("DistributedDataParallel.forward", 20, 30, cat="user_annotation"), ev("aten::conv2d", 21, 8),
              ev("c10d::broadcast_", 30, 5), ev("gloo:all_reduce", 45, 25, tid=GLOO, cat="user_annotation"),
              ev("aten::add_", 60, 20), ev("Optimizer.step#SGD.step", 80, 10, cat="user_annotation"),
              ev("aten::add_", 82, 5), ev("aten::mul", 150, 10)]  # the last one lies outside the window


def test_host_view_partitions_the_window_by_hand():
    b = breakdown_of_events(CPU_WINDOW)
    assert b["view"] == "host"
    assert b["span_s"] == pytest.approx(100e-6)
    parts = {k: round(v * 1e6, 6) for k, v in b["parts_s"].items()}
    # every instant inside DistributedDataParallel.forward as compute would give compute 45, communication 15
    assert parts == {"compute": 28.0, "communication": 20.0, "data_wait": 20.0, "optimizer": 10.0, "other": 22.0}
    assert sum(b["parts_s"].values()) == pytest.approx(b["span_s"])
    # in flight: the broadcast 30-35 and gloo's 45-70; exposed 20 (30-35, 45-60), overlapped 10 (60-70 only)
    assert b["communication_total_s"] == pytest.approx(30e-6)
    assert b["communication_overlapped_s"] == pytest.approx(10e-6)
    assert b["shares"]["data_wait"] == pytest.approx(0.2)


# The waits of issue 25, as torch 2.x names them (µs; gloo's collectives on their own thread):
#   0-40   FSDP::all_gather (features.0), a record_function scope; in it c10d::_allgather_base_ 0-4 (the call
#          that launches it); gloo:all_gather 4-36 on gloo's thread; the main thread waits in the scope until 36;
#          FSDP's copy-out ops 36-40                                  -> communication 36, compute 4
#   40-70  backward: evaluate_function: AccumulateGrad 40-70 (a cpu_op wrapper) over AccumulateGrad 40-44
#          (compute 4); then the comm hook's future.wait(), no op under the wrapper, while gloo:all_reduce
#          44-66 runs -> communication 22; 66-70 the wrapper, nothing in flight -> other 4
#   70-90  aten::mm 70-90 while gloo:all_reduce 75-85 runs           -> compute 20 (10 of it overlapped)
#   90-100 PythonSubclass 90-100 (FSDP2's DTensor dispatch), nothing under it, nothing in flight -> other 10
WAITS_WINDOW = [
    span(),
    ev("FSDP::all_gather (features.0)", 0, 40, cat="user_annotation"), ev("c10d::_allgather_base_", 0, 4),
    ev("gloo:all_gather", 4, 32, tid=GLOO, cat="user_annotation"), ev("aten::copy_", 4.5, 1, tid=GLOO),
    ev("fsdp::split_with_sizes_copy", 36, 4),
    ev("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 40, 30),
    ev("torch::autograd::AccumulateGrad", 40, 4), ev("aten::empty", 50, 0),  # an instant: runs for no time
    ev("gloo:all_reduce", 44, 22, tid=GLOO, cat="user_annotation"),
    ev("aten::mm", 70, 20), ev("gloo:all_reduce", 75, 10, tid=GLOO, cat="user_annotation"),
    ev("PythonSubclass", 90, 10),
]


def test_a_thread_waiting_in_a_scope_with_no_operator_is_waiting_not_computing():
    b = breakdown_of_events(WAITS_WINDOW)
    parts = {k: round(v * 1e6, 6) for k, v in b["parts_s"].items()}
    # every innermost event as compute (the old rule) would give compute 96, communication 4, other 0
    assert parts == {"compute": 28.0, "communication": 58.0, "data_wait": 0.0, "optimizer": 0.0, "other": 14.0}
    # in flight 0-4, 4-36, 44-66, 75-85 = 68; only the all-reduce under aten::mm (75-85) overlapped, not 64
    assert b["communication_total_s"] == pytest.approx(68e-6)
    assert b["communication_overlapped_s"] == pytest.approx(10e-6)


def test_only_operators_count_as_running():
    assert runs_operator("cpu_op", "aten::mm") and runs_operator("cpu_op", "torch::autograd::AccumulateGrad")
    assert not runs_operator("user_annotation", "DistributedDataParallel.forward")
    assert not runs_operator("cpu_op", "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad")
    assert not runs_operator("cpu_op", "PythonSubclass")
    for wait in ("aten::wait", "_c10d_functional::wait_tensor"):  # blocking on a collective: communication
        assert host_kind(wait) == "comm", wait


# A GPU window, 100 µs, kernels linked to their launches by correlation id:
#   0-5   the batch's host-to-device copy                                      -> data wait 5
#   5-8   device idle, host thread in no op                                    -> other 3
#   8-10  device idle, host launching the convolution                          -> compute 2
#   10-40 the convolution kernel (30-40: NCCL's all-reduce runs beside it)     -> compute 30
#   40-60 NCCL's kernel alone                                                  -> communication 20
#   60-68 device idle, host in the DataLoader's next                           -> data wait 8
#   68-70 nothing                                                              -> other 2
#   70-75 device idle, host in Optimizer.step; 75-85 the kernel it launched     -> optimizer 15
#   85-100 nothing                                                             -> other 15
GPU_WINDOW = [
    span(),
    ev("aten::copy_", 0, 2), ev("cudaMemcpyAsync", 0.5, 1, cat="cuda_runtime", correlation=1),
    ev("Memcpy HtoD (Pinned -> Device)", 0, 5, tid=7, cat="gpu_memcpy", correlation=1),
    ev("aten::conv2d", 8, 4), ev("cudaLaunchKernel", 9, 1, cat="cuda_runtime", correlation=2),
    ev("void cudnn::conv_fwd(...)", 10, 30, tid=7, cat="kernel", correlation=2),
    ev("nccl:all_reduce", 12, 2, cat="user_annotation"), ev("cudaLaunchKernel", 12.5, 1, cat="cuda_runtime", correlation=3),
    ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)", 30, 30, tid=13, cat="kernel", correlation=3),
    ev("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 60, 8, cat="user_annotation"),
    ev("Optimizer.step#SGD.step", 70, 5, cat="user_annotation"),
    ev("cudaLaunchKernel", 71, 1, cat="cuda_runtime", correlation=4),
    ev("void multi_tensor_apply_kernel(...)", 75, 10, tid=7, cat="kernel", correlation=4),
]


def test_device_view_partitions_the_window_by_hand():
    b = breakdown_of_events(GPU_WINDOW)
    assert b["view"] == "device"
    parts = {k: round(v * 1e6, 6) for k, v in b["parts_s"].items()}
    assert parts == {"compute": 32.0, "communication": 20.0, "data_wait": 13.0, "optimizer": 15.0, "other": 20.0}
    # in flight on the device: NCCL 30-60 (the host's 2 µs launch call is not communication on the device)
    assert b["communication_total_s"] == pytest.approx(30e-6)
    assert b["communication_overlapped_s"] == pytest.approx(10e-6)  # under the convolution, 30-40


def test_a_kernel_launched_from_dataparallel_broadcast_is_communication():
    events = [span(), ev("Broadcast", 0, 10), ev("cudaMemcpyPeerAsync", 1, 1, cat="cuda_runtime", correlation=9),
              ev("Memcpy PtoP (Device -> Device)", 10, 40, tid=7, cat="gpu_memcpy", correlation=9)]
    b = breakdown_of_events(events)
    # 0-10: the device idle, the host in Broadcast: communication; 10-50 the copy: communication; 50-100 other
    assert b["parts_s"]["communication"] == pytest.approx(50e-6)
    assert b["parts_s"]["other"] == pytest.approx(50e-6)


SLEEP_S, LATE_S = 0.2, 0.6


def _wait_in_a_scope(rank: int, port: int, trace: str) -> None:
    """Rank 0 profiles a window that starts an all-reduce rank 1 joins LATE_S late (so it is in flight on gloo's
    thread the whole window), computes for ~0.1 s beside it, then sleeps and waits in a record_function scope
    with no operator under it; the truth is known by construction."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), KINETO_LOG_LEVEL="5")  # no GPU: no ERROR
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x, a = torch.ones(1 << 16), torch.ones(64, 64)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if rank == 0 else None
    if profiler is not None:
        profiler.start()
    dist.barrier()
    if profiler is not None:
        with torch.profiler.record_function("harness.window"):
            work = dist.all_reduce(x, async_op=True)
            start = time.perf_counter()
            while time.perf_counter() - start < 0.1:
                torch.mm(a, a)  # computing while the all-reduce is in flight: overlapped
            with torch.profiler.record_function("some.scope"):
                time.sleep(SLEEP_S)  # neither: a thread in a scope, no operator
                work.wait()
        profiler.stop()
        profiler.export_chrome_trace(trace)
    else:
        time.sleep(LATE_S)
        dist.all_reduce(x)
    dist.barrier()
    dist.destroy_process_group()
    leave_at_once()


@pytest.mark.slow
def test_a_real_rank_sleeping_in_a_scope_while_gloo_communicates_is_exposed_communication(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    trace = tmp_path / "rank0.json"
    start_ranks(_wait_in_a_scope, (port, str(trace)), 2)
    events = json.loads(trace.read_text())["traceEvents"]
    scope = next(e for e in events if e.get("name") == "some.scope")
    gloo = [e for e in events if e.get("name") == "gloo:all_reduce" and e["tid"] != scope["tid"]]  # gloo's thread
    mms = [e for e in events if e.get("name") == "aten::mm"]

    def in_flight(e: dict) -> float:
        """Seconds of event e during which gloo's all-reduce was in flight."""
        return sum(max(0.0, min(e["ts"] + e["dur"], g["ts"] + g["dur"]) - max(e["ts"], g["ts"])) for g in gloo) / 1e6

    mm_s, mm_in_flight_s, scope_in_flight_s = sum(e["dur"] for e in mms) / 1e6, sum(map(in_flight, mms)), in_flight(scope)
    b = breakdown(trace)
    parts = b["parts_s"]
    seen = f"{parts}, mm {mm_s:.4f} s ({mm_in_flight_s:.4f} in flight), scope in flight {scope_in_flight_s:.4f} s"
    assert scope_in_flight_s >= SLEEP_S, seen  # the construction held: rank 1 joined after rank 0's sleep
    # the scope (in flight throughout) is communication, not compute: the old rule made compute mm_s + the
    # scope's ~0.5 s and communication ~2 ms (the launching call)
    assert parts["communication"] >= scope_in_flight_s, seen
    assert parts["compute"] == pytest.approx(mm_s, rel=0.05), seen  # the operators, and nothing else
    assert b["communication_overlapped_s"] == pytest.approx(mm_in_flight_s, rel=0.05, abs=1e-3), seen


def test_a_trace_without_the_window_annotation_is_refused(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [ev("aten::add", 0, 1)]}))
    with pytest.raises(ValueError, match="harness.window"):
        breakdown(path)


def test_run_breakdown_is_the_slowest_ranks_and_profiling_cost_is_against_steady_windows(tmp_path):
    b = breakdown_of_events(CPU_WINDOW)
    records = [RankRecord(rank=r, profile={"trace": str(tmp_path / f"traces/rank{r}.json"), "end_iter": 20,
                                           "window_s": seconds, **b}) for r, seconds in ((0, 0.5), (1, 0.7))]
    windows = [Window(10, 2.0, 2.0, True), Window(20, 0.7, 2.7, False, profiled=True),
               Window(30, 0.4, 3.1, False), Window(40, 0.6, 3.7, False)]
    section = profile_section(records, windows, tmp_path)
    assert section["run"]["rank"] == 1 and section["traces"] == ["traces/rank0.json", "traces/rank1.json"]
    assert section["slowdown"] == pytest.approx(0.7 / 0.5)  # the profiled window over the steady median
    assert "trace" not in section["run"] and set(section["per_rank"]) == {"0", "1"}
