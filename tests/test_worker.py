"""harness.rank.worker: a rank stops on SIGTERM/SIGINT at its next iteration, and a signal never cuts short
the write of what it measured."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from conftest import rank_spec

from harness.core.stops import Interrupted, StopRequest
from harness.rank.worker import run_rank


def test_the_handler_notes_and_never_raises():
    stop = StopRequest().install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, between two bytecodes: nothing raised
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signal == "SIGTERM"  # the first one is kept
        with pytest.raises(Interrupted, match="stopped by SIGTERM"):
            stop.check()
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def single_spec(tmp_path, iterations: int = 200) -> dict:
    return rank_spec(tmp_path / "ranks", "single", batch_size=4, iterations=iterations, gpus=[], nprocs=1)


def test_sigterm_mid_training_ends_at_the_next_iteration_with_its_windows_recorded(tmp_path, monkeypatch):
    import harness.rank.worker as worker

    real = worker.fault_injector

    def sigterm_at_50(fault, rank, accelerator):  # the launcher stopping this rank during iteration 50
        return lambda it: os.kill(os.getpid(), signal.SIGTERM) if it == 50 else real(fault, rank, accelerator)(it)

    monkeypatch.setattr(worker, "fault_injector", sigterm_at_50)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(Interrupted):
            run_rank(single_spec(tmp_path))
    finally:
        torch.set_num_threads(threads)
    record = json.loads((tmp_path / "ranks" / "rank0.json").read_text())
    assert record["status"] == "interrupted" and record["error"] == "Interrupted: stopped by SIGTERM"
    assert [w["end_iter"] for w in record["windows"]] == [20, 40]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


@pytest.mark.slow
def test_a_workers_library_noise_goes_to_run_log_and_only_its_records_to_the_terminal(tmp_path):
    """setup_worker points file descriptors 1 and 2 at run.log: a library's print and a C library's write
    (what "No CUDA runtime is found" and the profiler's notes are) land there; the harness's own records reach
    the terminal (rank 0), and run.log too."""
    import subprocess
    import sys

    log = tmp_path / "run.log"
    script = (f"import logging, os, sys\nfrom harness.core.logs import setup_worker\nsetup_worker({str(log)!r}, 0)\n"
              "print('a library prints this')\nos.write(2, b'a C library writes this\\n')\n"
              "logging.getLogger('harness').info('the window line')\n"
              "logging.getLogger('harness').warning('a warning of ours')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "the window line\n" and proc.stderr == "warning: a warning of ours\n"
    kept = log.read_text()
    for line in ("a library prints this", "a C library writes this", "the window line", "a warning of ours"):
        assert line in kept


def test_set_up_frees_what_the_strategy_dropped_before_the_first_iteration():
    """strategy=pp keeps its own stages of the pipeline's trace; the rest of the model sits in torch.export's
    reference cycles. set_up collects them: a rank holds its stages' parameters alone (not all of them until
    Python's collector happens to run, which put every rank's peak at the whole model's)."""
    import torch.distributed as dist
    from torch.multiprocessing.reductions import StorageWeakRef

    from harness.prediction.calibrate import fake_process_group
    from harness.rank.gpt import GPT
    from harness.rank.worker import set_up
    from strategies.pp import cut

    storages: list[StorageWeakRef] = []

    def built() -> torch.nn.Module:
        model = GPT(layers=2, width=16, heads=2, vocab_size=32, seq_len=8)
        storages.extend(StorageWeakRef(p.untyped_storage()) for p in model.parameters())
        return model

    class FirstStage:  # the pipeline's cut as strategy=pp makes it, rank 0 of 2
        @staticmethod
        def setup_module(model, amp, optimizer):
            return cut(model, "gpipe", 2, 4, torch.device("cpu"), ranks=[0, 1], rank=0), None

    fake_process_group(2)
    try:
        stages, _ = set_up(FirstStage(), built, None, None)
        kept = {p.untyped_storage().data_ptr() for p in stages.parameters()}
        alive = [s for s in storages if not s.expired()]
        assert len(kept) < len(storages)  # the first stage holds some of the model
        assert len(alive) == len(kept)  # and nothing else of it is alive
    finally:
        dist.destroy_process_group()
