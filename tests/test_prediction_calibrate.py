"""This machine's calibration (harness.prediction.calibrate) says when it cannot be trusted: other processes' load
measured while it is timed, matrix products re-timed beside it; the flag reaches plan.json and the plan's table."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from harness.planning import tables
from harness.prediction.calibrate import BUSY_CORES, Calibration, background_load, child_context


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.slow
def test_another_process_spinning_beside_the_timing_is_counted():
    spinner = multiprocessing.get_context("fork").Process(target=_spin, args=(3.0,))  # fork: no imports to wait for
    spinner.start()
    try:
        time.sleep(0.5)  # started and spinning
        with background_load() as load:
            time.sleep(1.5)  # this process idles: what the system did was someone else's
    finally:
        spinner.join()
    assert load[0] > 0.7  # one core spun the whole time (another test worker may add to it, never take from it)


def test_a_calibration_says_why_it_was_busy():
    quiet = Calibration(0.1, 0.01, 5, 8, 2, 0.11, background_cores=0.05, gemm_ratio=0.97)
    assert quiet.busy is None and quiet.as_dict()["busy"] is None
    loaded = Calibration(0.1, 0.01, 5, 8, 2, 0.11, background_cores=BUSY_CORES + 0.5, gemm_ratio=0.97)
    assert "other processes kept 0.75 cores busy" in loaded.busy
    slow = Calibration(0.1, 0.01, 5, 8, 2, 0.11, background_cores=0.0, gemm_ratio=0.5)
    assert "50% of this machine's measured rate" in slow.busy


def test_a_busy_calibration_is_flagged_in_the_prediction_and_the_plans_table(monkeypatch):
    from conftest import run_config

    from harness.core.amp_levels import AmpConfig, resolve
    from harness.prediction import predict as predict_module
    from harness.prediction.hardware import load_preset

    busy = Calibration(0.2, 0.01, 5, 6, 1, 0.25, background_cores=1.5, gemm_ratio=0.6)
    monkeypatch.setattr(predict_module, "calibrate_fn_default", lambda cfg, amp, micro, threads: busy)
    machine = {"accelerator": "cpu", "devices_per_node": 1, "nodes": 1, "device_memory_gib": 8.0, "memory_gbps": 10.0,
               "peak_tflops": {"float32": 0.1, "bfloat16": 0.1, "float16": 0.1},
               "intra": {"latency_us": 1.0, "bandwidth_gbps": 1.0}, "inter": {"latency_us": 1.0, "bandwidth_gbps": 1.0}}
    cfg = run_config("single", nprocs=1, batch_size=6)
    from hydra.utils import get_class

    from harness.launch.decide import run_plan as place_run
    from harness.launch.placement import Hardware

    decided = place_run(cfg, Hardware(visible_gpus=(), cores=1), in_sweep=True)
    prediction = predict_module.predict(cfg, decided.placement, resolve(AmpConfig(level="O0"), "cpu"),
                                        get_class(cfg.strategy["_target_"]),
                                        predict_module.Target(load_preset("local", machine=machine), 1))
    record = prediction.as_dict()
    assert record["busy"] and "1.50 cores" in record["busy"]
    assert any(a.startswith("calibrated on a busy machine") for a in record["assumptions"])
    low, high = record["throughput_band"]
    assert low < record["throughput_img_s"] < high
    row = {"strategy": "single", "amp": "O0", "variant": "", "status": "predicted", "reason": None,
           "hardware": "local", "prediction": record}
    text = tables([row])
    assert " *" in text and "* calibrated on a busy machine" in text and "1.50 cores" in text


@pytest.mark.parametrize("ratio", [None, 1.0])
def test_no_cached_rate_or_a_quiet_one_is_not_busy(ratio):
    assert Calibration(0.1, 0.01, 5, 8, 2, 0.1, background_cores=0.0, gemm_ratio=ratio).busy is None


@pytest.mark.slow
def test_the_calibration_of_a_gpu_runs_in_a_child_of_the_fork_server_and_comes_back():
    """The path a GPU run's prediction takes with plan.calibration=model (a child process, so the parent never
    opens a CUDA context), here with the CPU as its device: the function sent must pickle by name. The cached
    one did not, and on an H200 such runs went unpredicted ("Can't pickle <function _calibrate>: it's not the
    same object"). The child is forked from the fork server the runs fork from (not spawned: a spawned child
    imported torch again, 4 s before a sweep's first prediction on this CPU)."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    import psutil

    from harness.core.amp_levels import AmpConfig, resolve
    from harness.core.config import DataConfig
    from harness.core.inputs import inputs_of
    from harness.prediction.calibrate import _in_child
    from harness.prediction.trace import hashable

    model = {"_target_": "harness.rank.models.TinyCNN", "num_classes": 10}
    inputs = inputs_of(model, DataConfig(name="synthetic", image_size=16, num_classes=10))
    sgd = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.01}
    got = _in_child(hashable(model), inputs, resolve(AmpConfig(level="O0"), "cpu"), hashable(sgd), 4, 1, 1, "cpu")
    assert isinstance(got, Calibration) and got.forward_backward_s > 0
    with ProcessPoolExecutor(1, mp_context=child_context()) as pool:
        parent = psutil.Process(pool.submit(os.getppid).result())
    assert "multiprocessing.forkserver" in " ".join(parent.cmdline()), parent.cmdline()
