"""strategy=horovod: refused or skipped with the build recipe where horovod is missing (CI), and where it is
installed (README: "Horovod, XLA and MPI"), two workers started like DDP's average their gradients."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from amp import Amp
from amp.levels import AmpConfig, resolve
from harness.errors import Incompatible
from harness.rank.devices import Placement
from strategies.base import RankEnv
from strategies.horovod import INSTALL_HINT, HorovodStrategy

HAVE_HOROVOD = importlib.util.find_spec("horovod") is not None
CPU2 = Placement(accelerator="cpu", gpus=(), torch_indices=(), nprocs=2, one_process_per_device=True,
                 devices=("cpu:0", "cpu:1"), threads_per_process=1, global_batch=2)


@pytest.mark.skipif(HAVE_HOROVOD, reason="horovod is installed here")
def test_missing_horovod_is_a_reason_with_the_build_recipe():
    assert HorovodStrategy.unavailable_reason() == INSTALL_HINT
    assert "HOROVOD_WITH_PYTORCH=1" in INSTALL_HINT and "horovod==0.28.1" in INSTALL_HINT


@pytest.mark.parametrize(("overrides", "key"), [
    (dict(level="O1", impl="apex"), "amp.impl"),
    (dict(level="O1", dtype="float16"), "amp.loss_scale"),  # fp16 at O1: dynamic scaling
])
def test_combinations_horovod_would_run_wrongly_are_refused(overrides, key):
    with pytest.raises(Incompatible, match=key):
        HorovodStrategy.check_compatible(CPU2, resolve(AmpConfig(**overrides), "cuda"))


def test_fixed_loss_scale_and_bfloat16_are_accepted():
    HorovodStrategy.check_compatible(CPU2, resolve(AmpConfig(level="O1", dtype="float16", loss_scale=1024.0), "cuda"))
    HorovodStrategy.check_compatible(CPU2, resolve(AmpConfig(level="O1", dtype="bfloat16"), "cpu"))


def _one_step(rank: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    strategy = HorovodStrategy()
    strategy.setup(RankEnv(rank, rank, 2, CPU2, 60))
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(10.0 * (rank + 1))  # rank 0: 10, rank 1: 20 (rank 0's must win)
    amp = Amp(resolve(AmpConfig(level="O0"), "cpu"), torch.device("cpu"))
    model, optimizer = strategy.setup_module(model, amp, lambda params: torch.optim.SGD(params, lr=1.0))
    model(torch.full((1, 2), float(rank + 1))).sum().backward()  # gradient: rank + 1 per weight
    amp.step(optimizer)
    amp.zero_grad(optimizer)
    Path(out, f"rank{rank}.json").write_text(json.dumps(model.weight.detach().flatten().tolist()))
    strategy.teardown()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_HOROVOD, reason="horovod is not installed (README: 'Horovod, XLA and MPI')")
def test_two_workers_start_from_rank_0_weights_and_average_gradients(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_one_step, args=(port, str(tmp_path)), nprocs=2, join=True)
    weights = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # 10 - mean(1, 2) = 8.5; not 10 - 3 (summed), not 10 - 1 / 20 - 2 (not reduced), not 20 - 1.5 (no broadcast)
    assert weights == [[8.5, 8.5], [8.5, 8.5]]
