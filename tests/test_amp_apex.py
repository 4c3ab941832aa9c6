"""amp.apex against a fake apex as strict as apex 25.05 (tests/fake_apex.py quotes the line of apex each behaviour
mirrors): its option checks, the casts of the model and its inputs, its patched optimizer."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from conftest import amp_plugin, prepare, sgd, tiny_batch
from fake_apex import fake_apex  # noqa: F401 (fixture)
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from harness.core.amp_levels import AmpConfig, resolve
from harness.core.devices import Placement
from harness.core.errors import Incompatible
from harness.core.timing import WindowClock
from harness.rank.data import SyntheticSource
from harness.rank.models import TinyCNN
from harness.rank.trainer import train
from strategies.ddp import TorchDDP
from strategies.zero import ZeroDDP


def test_apex_o2_trains_past_its_first_iteration(fake_apex):  # noqa: F811
    """Before: the trainer called zero_grad(set_to_none=True) and apex's argument-less zero_grad raised
    TypeError at iteration 1."""
    spec = resolve(AmpConfig(level="O2", impl="apex", dtype="float16"), "cuda")
    precision = amp_plugin(spec)
    torch.manual_seed(0)
    model, optimizer = prepare(precision, TinyCNN(num_classes=10), sgd())
    before = [p.detach().clone() for p in model.parameters()]
    clock = WindowClock(lambda: None, warmup_windows=0)
    train(precision.wrap_module(model), optimizer, precision, SyntheticSource([tiny_batch()]), clock, iterations=4, log_every=2)
    assert [w.end_iter for w in clock.windows] == [2, 4]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # apex's own zero_grad ran: it zeroes the model's gradients in place (torch.optim's would have dropped them)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    assert all(p.dtype == torch.float32 for group in optimizer.param_groups for p in group["params"])  # masters
    assert precision.state()["final_loss_scale"] == 2.0 ** 16  # O2's dynamic scale, never halved here


def _conv_bn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.BatchNorm2d(4, affine=False), nn.Flatten(),
                         nn.LazyLinear(2))


def _dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    return {name: t.dtype for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_floating_point()}


@pytest.mark.parametrize(("level", "options", "batchnorm"), [
    ("O0", {}, torch.float32),
    ("O2", {}, torch.float32),  # keep_batchnorm_fp32 by default
    ("O2", {"keep_batchnorm_fp32": False}, torch.float16),
    ("O3", {}, torch.float16),
    ("O3", {"keep_batchnorm_fp32": True}, torch.float32),
])
def test_apex_casts_the_model_and_its_inputs_as_its_level_says(fake_apex, level, options, batchnorm):  # noqa: F811
    """apex casts the model at O2/O3 (affine batch norms kept in float32 with keep_batchnorm_fp32, the
    non-affine one's buffers cast too) and patches its forward to cast floating inputs to the model's type and
    the output to float32 (tests/fake_apex.py quotes apex's lines); the harness passes the level's options on."""
    spec = resolve(AmpConfig(level=level, impl="apex", dtype="float16", **options), "cuda")
    model = _conv_bn()
    model(torch.randn(2, 3, 5, 5))  # the lazy layer materialized in float32
    model, _ = prepare(amp_plugin(spec), model, sgd())
    half = torch.float16 if spec.cast_model else torch.float32
    assert _dtypes(model) == {"0.weight": half, "0.bias": half, "1.weight": batchnorm, "1.bias": batchnorm,
                              "1.running_mean": batchnorm, "1.running_var": batchnorm, "2.running_mean": half,
                              "2.running_var": half, "4.weight": half, "4.bias": half}
    seen = []
    model[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    out = model(torch.randn(2, 3, 5, 5))  # float32 in: the patched forward casts it
    assert seen == [half] and out.dtype == torch.float32


def test_apex_o1_is_given_no_model_options(fake_apex):  # noqa: F811
    """apex raises at O1 for any keep_batchnorm_fp32 or master_weights, even the harness's table values (True,
    False): amp.apex passes them only for the levels that cast the model. Without that guard, this raises."""
    spec = resolve(AmpConfig(level="O1", impl="apex", dtype="float16"), "cuda")
    assert (spec.keep_batchnorm_fp32, spec.master_weights) == (True, False)  # what the guard must hold back
    precision = amp_plugin(spec)
    model, optimizer = prepare(precision, TinyCNN(num_classes=10), sgd())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # O1 leaves the weights alone
    precision.backward(torch.nn.functional.cross_entropy(model(tiny_batch()[0]), tiny_batch()[1]))
    assert precision.state()["final_loss_scale"] == 2.0 ** 16  # O1's dynamic scaler, as apex's


@pytest.mark.parametrize(("options", "message"), [
    ({"keep_batchnorm_fp32": True}, "keep_batchnorm_fp32 should be None. keep_batchnorm_fp32 was True"),
    ({"keep_batchnorm_fp32": False}, "keep_batchnorm_fp32 should be None. keep_batchnorm_fp32 was False"),
    ({"master_weights": False}, "It doesn't make sense to use master_weights with O1"),
    ({"cast_model_type": torch.float16}, "the model weights themselves should remain FP32"),
])
def test_fake_apex_refuses_at_o1_what_apex_refuses(fake_apex, options, message):  # noqa: F811
    with pytest.raises(RuntimeError, match=message):
        fake_apex.amp.initialize(nn.Linear(2, 2), sgd()(nn.Linear(2, 2).parameters()), opt_level="O1", **options)
    fake_apex.amp.initialize(nn.Linear(2, 2), opt_level="O1", cast_model_type=torch.float32, verbosity=0)


def test_fake_apex_refuses_what_apex_refuses_at_every_level(fake_apex):  # noqa: F811
    amp = fake_apex.amp
    with pytest.raises(RuntimeError, match="should only be set by selecting opt_level='O1'"):
        amp.initialize(nn.Linear(2, 2), opt_level="O2", patch_torch_functions=True)
    with pytest.raises(AssertionError, match="keep_batchnorm_fp32 must be a boolean"):
        amp.initialize(nn.Linear(2, 2), opt_level="O2", keep_batchnorm_fp32="yes")
    with pytest.raises(RuntimeError, match="Unexpected optimization level 02"):
        amp.initialize(nn.Linear(2, 2), opt_level="02")
    with pytest.raises(RuntimeError, match="you do not need to call .half"):
        amp.initialize(nn.Linear(2, 2).half(), opt_level="O2")
    with pytest.raises(RuntimeError, match="Parallel wrappers should only be applied"):
        amp.initialize(nn.DataParallel(nn.Linear(2, 2)), opt_level="O2")
    model = nn.Linear(2, 2)
    optimizer = sgd()(model.parameters())
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", keep_batchnorm_fp32="False")
    with pytest.raises(RuntimeError, match="should only be passed through amp.initialize once"):
        amp.initialize(nn.Linear(2, 2), optimizer, opt_level="O2")


def test_zero_refuses_apex_where_apex_keeps_master_weights():
    """apex swaps fp32 masters into the optimizer's param_groups, which ZeroRedundancyOptimizer never steps
    (it steps the inner optimizer it built from the half parameters); apex then copies the unchanged masters
    back over the model, so the weights would never train. Without masters both step the same tensors."""
    gpus = Placement("cuda", (0, 1), (0, 1), 2, True, ("cuda:0", "cuda:1"), 1, 8)
    o2 = resolve(AmpConfig(level="O2", impl="apex", dtype="float16"), "cuda")
    with pytest.raises(Incompatible, match=r"amp.impl=apex is not allowed: native with strategy=zero at O2"):
        ZeroDDP.check_compatible(gpus, o2)
    with pytest.raises(Incompatible, match="never|copies back"):
        ZeroDDP.check_compatible(gpus, resolve(AmpConfig("O3", impl="apex", master_weights=True), "cuda"))
    for allowed in (AmpConfig("O1", impl="apex"), AmpConfig("O2", impl="apex", master_weights=False),
                    AmpConfig("O3", impl="apex"), AmpConfig("O2")):
        ZeroDDP.check_compatible(gpus, resolve(allowed, "cuda"))
    TorchDDP.check_compatible(gpus, o2)  # DDP steps apex's optimizer itself, masters included


def test_zero_never_steps_parameters_swapped_into_its_param_groups():
    """Why the refusal above: apex O2 swaps each half parameter in the optimizer's param_groups for an fp32
    master (apex/amp/_process_optimizer.py, lazy_init_with_master_weights: `param_group['params'][i] =
    master_param`); ZeroRedundancyOptimizer's step runs its inner optimizer, built from the parameters it was
    given, so the master keeps its value (then apex copies it back over the model: no training at all)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        half = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
        zero = ZeroRedundancyOptimizer([half], optimizer_class=torch.optim.SGD, lr=0.5)
        master = torch.nn.Parameter(half.detach().float())
        zero.param_groups[0]["params"][0] = master  # what apex does to the optimizer it is given
        master.grad = torch.ones(4)
        half.grad = torch.ones(4, dtype=torch.float16)
        zero.step()
        assert torch.equal(master, torch.ones(4))  # a plain SGD over param_groups would give 1 - 0.5 = 0.5
        assert torch.equal(half, torch.full((4,), 0.5, dtype=torch.float16))  # the half weight was stepped
    finally:
        dist.destroy_process_group()
