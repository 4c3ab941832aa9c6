"""strategy=xla: skipped with the install recipe where torch_xla is missing (CI's environment), and in the
XLA environment (docs/backends.md: "Horovod, XLA and MPI") data-parallel over two XLA devices really splits the batch
and trains the same model as one device."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from test_backends import run_config

from harness.core.errors import ConfigError
from harness.launch.decide import run_plan as plan
from harness.launch.placement import probe_hardware
from strategies.xla import INSTALL_HINT, XlaStrategy

HAVE_XLA = importlib.util.find_spec("torch_xla") is not None


@pytest.mark.skipif(HAVE_XLA, reason="torch_xla is installed here")
def test_missing_torch_xla_is_a_reason_with_the_recipe():
    assert XlaStrategy.unavailable_reason() == INSTALL_HINT
    assert "torch_xla==2.9.0" in INSTALL_HINT and "torch==2.9.0" in INSTALL_HINT


def test_devices_below_one_is_refused_before_anything_starts():
    with pytest.raises(ConfigError, match="strategy.devices=0"):
        plan(run_config("strategy=xla", "strategy.devices=0"), probe_hardware())


SCRIPT = """
import json, sys, torch
from torch import nn
from amp import Amp, OptimizerSpec
from harness.core.amp_levels import AmpConfig, resolve
from harness.core.devices import Placement
from strategies.base import RankEnv
from strategies.xla import XlaStrategy
import torch_xla

devices = int(sys.argv[1])
placement = Placement(accelerator="cpu", gpus=(), torch_indices=(), nprocs=1, one_process_per_device=False,
                      devices=("cpu",), threads_per_process=1, global_batch=4)
strategy = XlaStrategy(devices=devices)
strategy.setup(RankEnv(0, 0, 1, placement, 60))
torch.manual_seed(0)
amp = Amp(resolve(AmpConfig(level="O0"), "cpu"), strategy.device)
model, optimizer = strategy.setup_module(nn.Linear(3, 2), amp, OptimizerSpec(torch.optim.SGD, {"lr": 0.5}))
x = torch.arange(12.0).reshape(4, 3).to(strategy.device) / 10
y = torch.tensor([0, 1, 1, 0]).to(strategy.device)
for _ in range(3):
    loss = nn.functional.cross_entropy(model(x), y)
    amp.backward(loss)
    amp.step(optimizer)
    amp.zero_grad(optimizer)
strategy.synchronize()
spec = torch_xla._XLAC._get_xla_sharding_spec(x)
params = {k: v.flatten().tolist() for k, v in strategy.full_parameters(model).items()}
print(json.dumps({"spec": spec, "params": params, "compile": strategy.compile_seconds()}))
"""


def _eager_reference() -> dict[str, list[float]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = torch.arange(12.0).reshape(4, 3) / 10, torch.tensor([0, 1, 1, 0])
    for _ in range(3):
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().flatten().tolist() for k, v in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_XLA, reason="torch_xla is not installed (docs/backends.md: 'Horovod, XLA and MPI')")
def test_two_xla_devices_split_the_batch_and_train_like_eager_torch():
    runs = {}
    for devices in (1, 2):
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(devices)], capture_output=True, text=True,
                              timeout=300, env={"PJRT_DEVICE": "CPU", "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[devices] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "devices=[2" in runs[2]["spec"]  # the batch is split over the two devices...
    assert runs[1]["spec"] == ""  # ...and not annotated with one device
    reference = _eager_reference()
    for devices in (1, 2):
        assert runs[devices]["compile"] > 0
        for name, values in reference.items():
            assert runs[devices]["params"][name] == pytest.approx(values, abs=1e-5), (devices, name)
