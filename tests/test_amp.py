"""AMP O0-O3: apex's table resolved per accelerator, what each level does to a model and its optimizer,
dynamic loss scaling, casting inside forward (DataParallel replica threads) and O2 under real DDP."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import amp_plugin, leave_at_once, prepare, sgd, start_ranks, tiny_batch
from torch import nn

from amp import Amp, plugin_class
from amp.native import CastingModule, NativeAmp
from harness.core.amp_levels import AmpConfig, AmpSpec, plugin_path, resolve
from harness.core.errors import ConfigError
from harness.rank.models import TinyCNN


def unavailable_reason(spec: AmpSpec, accelerator: str) -> str | None:
    return plugin_class(plugin_path(spec.impl)).unavailable_reason(spec, accelerator)


def skip_reason(spec: AmpSpec, accelerator: str) -> str | None:
    return plugin_class(plugin_path(spec.impl)).skip_reason(spec, accelerator)

LEVELS = ("O0", "O1", "O2", "O3")
HALVES = ("float16", "bfloat16")
CPU = torch.device("cpu")


# --- apex's table, resolved ---------------------------------------------------------------------------

@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("accelerator", "dtype"), [("cuda", "float16"), ("cpu", "bfloat16")])
def test_auto_dtype_per_accelerator(level, accelerator, dtype):
    spec = resolve(AmpConfig(level=level), accelerator)
    assert spec.level == level and spec.impl == "native"
    assert spec.dtype == ("float32" if level == "O0" else dtype)


@pytest.mark.parametrize(("level", "cast_model", "autocast", "keep_bn", "master", "fp16_scale"), [
    ("O0", False, False, True, False, 1.0),
    ("O1", False, True, True, False, "dynamic"),
    ("O2", True, False, True, True, "dynamic"),
    ("O3", True, False, False, False, 1.0),
])
def test_level_table(level, cast_model, autocast, keep_bn, master, fp16_scale):
    fp16 = resolve(AmpConfig(level=level), "cuda")
    assert (fp16.cast_model, fp16.autocast, fp16.keep_batchnorm_fp32, fp16.master_weights) == \
        (cast_model, autocast, keep_bn, master)
    assert fp16.loss_scale == fp16_scale
    bf16 = resolve(AmpConfig(level=level), "cpu")
    assert bf16.loss_scale == 1.0  # bfloat16 has fp32's range: no scaling unless asked for
    assert bf16.as_dict() == {**fp16.as_dict(), "dtype": bf16.dtype, "loss_scale": 1.0}


def test_explicit_settings_win():
    spec = resolve(AmpConfig(level="O1", dtype="bfloat16", loss_scale="dynamic"), "cuda")
    assert (spec.dtype, spec.loss_scale) == ("bfloat16", "dynamic")
    spec = resolve(AmpConfig(level="O2", dtype="float16", loss_scale=128.0), "cpu")
    assert (spec.dtype, spec.loss_scale) == ("float16", 128.0)
    spec = resolve(AmpConfig(level="O3", keep_batchnorm_fp32=True, master_weights=True), "cuda")
    assert spec.keep_batchnorm_fp32 is True and spec.master_weights is True


def test_o0_is_fp32_whatever_is_asked():
    spec = resolve(AmpConfig(level="O0", dtype="float16", loss_scale="dynamic"), "cuda")
    assert (spec.dtype, spec.loss_scale, spec.cast_model, spec.autocast) == ("float32", 1.0, False, False)


@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.parametrize("key", ["keep_batchnorm_fp32", "master_weights"])
def test_cast_options_refused_for_levels_that_do_not_cast(level, key):
    row = resolve(AmpConfig(level=level), "cuda")
    with pytest.raises(ConfigError) as info:
        resolve(AmpConfig(level=level, **{key: not getattr(row, key)}), "cuda")
    assert info.value.key == f"amp.{key}" and level in str(info.value)
    # repeating the level's own value is harmless
    assert getattr(resolve(AmpConfig(level=level, **{key: getattr(row, key)}), "cuda"), key) == \
        getattr(row, key)


def test_apex_is_unavailable_here_and_says_why():
    """No apex and no CUDA on this machine: a reason naming apex, never an attempt to run."""
    for accelerator in ("cpu", "cuda"):
        spec = resolve(AmpConfig(level="O1", impl="apex"), accelerator)
        reason = unavailable_reason(spec, accelerator)
        if accelerator == "cuda" and reason is None:
            continue  # apex installed on a GPU machine
        assert reason and "apex" in reason
    assert unavailable_reason(resolve(AmpConfig(level="O2"), "cpu"), "cpu") is None


# --- what each level does to a model --------------------------------------------------------------------

def spec_for(level: str, dtype: str, **amp) -> AmpSpec:
    return resolve(AmpConfig(level=level, dtype=dtype, **amp), "cpu")


def prepared(spec: AmpSpec, seed: int = 0):
    torch.manual_seed(seed)
    precision = amp_plugin(spec)
    model, optimizer = prepare(precision, TinyCNN(num_classes=10), sgd())
    return precision, model, optimizer


def layer_dtypes(model: nn.Module) -> tuple[set[torch.dtype], set[torch.dtype]]:
    """(dtypes of conv/linear weights, dtypes of batch-norm parameters and buffers that are floats)."""
    compute, norm = set(), set()
    for module in model.modules():
        if isinstance(module, nn.Conv2d | nn.Linear):
            compute |= {p.dtype for p in module.parameters()}
        elif isinstance(module, nn.BatchNorm2d):
            norm |= {t.dtype for t in [*module.parameters(), module.running_mean, module.running_var]}
    return compute, norm


def one_step(precision: Amp, model: nn.Module, optimizer: torch.optim.Optimizer, seed: int = 0,
             wrapped: nn.Module | None = None) -> torch.Tensor:
    images, labels = tiny_batch(seed=seed)
    wrapped = wrapped or precision.wrap_module(model)
    with precision.forward_context():
        loss = F.cross_entropy(wrapped(images), labels)
    precision.backward(loss)
    precision.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize(("level", "compute", "norm", "masters"), [
    ("O0", "float32", "float32", False),
    ("O1", "float32", "float32", False),
    ("O2", "half", "float32", True),
    ("O3", "half", "half", False),
])
def test_model_dtypes_and_master_weights_per_level(dtype, level, compute, norm, masters):
    spec = spec_for(level, dtype)
    precision, model, optimizer = prepared(spec)
    half = getattr(torch, dtype)
    want = {"float32": torch.float32, "half": half}
    compute_dtypes, norm_dtypes = layer_dtypes(model)
    assert compute_dtypes == {want[compute]}
    assert norm_dtypes == {want[norm]}

    opt_params = [p for group in optimizer.param_groups for p in group["params"]]
    model_params = list(model.parameters())
    assert len(opt_params) == len(model_params)
    if masters:
        assert isinstance(precision, NativeAmp)
        assert opt_params == precision._master_params  # the optimizer steps the fp32 masters...
        assert all(p.dtype == torch.float32 for p in opt_params)
        assert not any(o is m for o in opt_params for m in model_params)  # ...not the half model
        for master, param in zip(opt_params, model_params, strict=True):
            assert torch.equal(master.to(param.dtype), param)
    else:
        assert all(o is m for o, m in zip(opt_params, model_params, strict=True))
    assert isinstance(precision, NativeAmp)
    if level == "O0":  # nothing wrapped, nothing cast, nothing scaled: plain PyTorch
        assert precision.wrap_module(model) is model and precision.scaler is None


@pytest.mark.parametrize("dtype", HALVES)
def test_o3_keep_batchnorm_fp32_override(dtype):
    precision, model, _ = prepared(spec_for("O3", dtype, keep_batchnorm_fp32=True))
    compute, norm = layer_dtypes(model)
    assert compute == {getattr(torch, dtype)} and norm == {torch.float32}
    assert isinstance(precision, NativeAmp) and precision.scaler is None


def test_o2_without_master_weights_steps_the_half_model():
    _, model, optimizer = prepared(spec_for("O2", "bfloat16", master_weights=False))
    opt_params = [p for group in optimizer.param_groups for p in group["params"]]
    assert all(o is m for o, m in zip(opt_params, model.parameters(), strict=True))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("level", LEVELS)
def test_a_step_updates_the_model(level, dtype):
    precision, model, optimizer = prepared(spec_for(level, dtype))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss = one_step(precision, model, optimizer)
    assert math.isfinite(loss.item())
    after = dict(model.named_parameters())
    # conv and linear weights; O3 may round a batch-norm weight's tiny update away (no masters: apex's caveat)
    moved = {name: not torch.equal(before[name], after[name]) for name in before if name.endswith("weight")
             and after[name].ndim > 1}
    assert len(moved) == 3 and all(moved.values()), moved
    assert precision.state()["skipped_steps"] == 0


@pytest.mark.parametrize("dtype", HALVES)
def test_o2_model_is_the_half_copy_of_the_masters_after_steps(dtype):
    precision, model, optimizer = prepared(spec_for("O2", dtype))
    masters = precision._master_params
    initial = [m.detach().clone() for m in masters]
    for seed in range(3):
        one_step(precision, model, optimizer, seed=seed)
    assert all(not torch.equal(i, m) for i, m in zip(initial, masters, strict=True))
    for master, param in zip(masters, model.parameters(), strict=True):
        assert master.dtype == torch.float32
        assert torch.equal(param, master.detach().to(param.dtype))
        assert param.grad is None and master.grad is None  # zero_grad reached the masters


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", HALVES)
def test_casting_module_returns_float32(level, dtype):
    precision, model, _ = prepared(spec_for(level, dtype))
    wrapped = precision.wrap_module(model)
    images, _ = tiny_batch()
    with precision.forward_context():
        out = wrapped(images)
    assert out.dtype == torch.float32 and out.shape == (4, 10)


def inner_linear_dtype_in_thread(wrapped: nn.Module, linear: nn.Linear) -> torch.dtype:
    """Run `wrapped` on a fresh thread (as DataParallel runs its replicas) and report the Linear's output dtype."""
    seen: list[torch.dtype] = []
    errors: list[BaseException] = []
    hook = linear.register_forward_hook(lambda module, args, output: seen.append(output.dtype))

    def forward() -> None:
        try:
            with torch.no_grad():
                wrapped(tiny_batch()[0])
        except BaseException as error:  # surface it in the test thread
            errors.append(error)

    thread = threading.Thread(target=forward)
    thread.start()
    thread.join()
    hook.remove()
    assert not errors, errors
    return seen[0]


@pytest.mark.parametrize("dtype", HALVES)
def test_o1_autocasts_inside_forward_on_another_thread(dtype):
    precision, model, _ = prepared(spec_for("O1", dtype))
    assert not torch.is_autocast_enabled("cpu")  # nothing enabled in this thread
    wrapped = precision.wrap_module(model)
    assert inner_linear_dtype_in_thread(wrapped, model.classifier) == getattr(torch, dtype)
    # without the wrapper the same thread runs fp32: the casting lives in the module, not the caller
    assert inner_linear_dtype_in_thread(model, model.classifier) == torch.float32


def test_casting_module_casts_inputs_for_cast_models():
    linear = nn.Linear(4, 2).to(torch.bfloat16)
    module = CastingModule(linear, input_dtype=torch.bfloat16, autocast_dtype=None, device_type="cpu")
    out = module(torch.randn(3, 4))
    assert out.dtype == torch.float32


def test_a_model_whose_loss_upcasts_keeps_its_half_outputs():
    """A fused cross-entropy upcasts chunk by chunk: a float32 copy of every logit would only double them. The GPT
    says so with loss_chunks; without them its outputs come back float32 as every other model's."""
    from harness.rank.gpt import GPT

    tokens = torch.randint(0, 32, (2, 8))
    for chunks, dtype in ((0, torch.float32), (2, torch.bfloat16)):
        model = GPT(layers=1, width=16, heads=2, vocab_size=32, seq_len=8, loss_chunks=chunks).to(torch.bfloat16)
        out = CastingModule(model, input_dtype=torch.bfloat16, autocast_dtype=None, device_type="cpu")(tokens)
        assert out.dtype == dtype
        spec = resolve(AmpConfig(level="O2", dtype="bfloat16"), "cpu")
        policy = NativeAmp(spec, torch.device("cpu")).sharded_precision(None, model)
        assert policy.output_dtype == (None if chunks else torch.float32)  # FSDP2's root output likewise
        assert model.loss(out, tokens).dtype == torch.float32


# --- loss scaling -----------------------------------------------------------------------------------------

def poison_grads_then_step(precision: Amp, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    images, labels = tiny_batch()
    wrapped = precision.wrap_module(model)
    with precision.forward_context():
        loss = F.cross_entropy(wrapped(images), labels)
    precision.backward(loss)
    next(model.parameters()).grad.fill_(float("inf"))  # an overflow, as a float16 gradient would have
    precision.step(optimizer)
    optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_dynamic_scaling_skips_the_overflowing_step_and_halves_the_scale(level):
    spec = spec_for(level, "float16")
    assert spec.loss_scale == "dynamic"
    precision, model, optimizer = prepared(spec)
    assert precision.scaler is not None and precision.scaler.get_scale() == 65536.0
    before = snapshot(model)
    masters_before = [m.detach().clone() for m in precision._master_params]

    poison_grads_then_step(precision, model, optimizer)

    assert all(torch.equal(b, a) for b, a in zip(before, snapshot(model), strict=True))
    assert all(torch.equal(b, m) for b, m in zip(masters_before, precision._master_params, strict=True))
    state = precision.state()
    assert state == {"final_loss_scale": 32768.0, "skipped_steps": 1}

    one_step(precision, model, optimizer)  # a good step goes through
    assert not all(torch.equal(b, a) for b, a in zip(before, snapshot(model), strict=True))
    assert precision.state() == {"final_loss_scale": 32768.0, "skipped_steps": 1}


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_dynamic_scale_grows_after_good_steps(level):
    precision, model, optimizer = prepared(spec_for(level, "float16"))
    precision.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    poison_grads_then_step(precision, model, optimizer)
    assert precision.state() == {"final_loss_scale": 512.0, "skipped_steps": 1}
    one_step(precision, model, optimizer)
    assert precision.state()["final_loss_scale"] == 512.0
    one_step(precision, model, optimizer)
    assert precision.state() == {"final_loss_scale": 1024.0, "skipped_steps": 1}
    for _ in range(2):
        one_step(precision, model, optimizer)
    assert precision.state() == {"final_loss_scale": 2048.0, "skipped_steps": 1}


@pytest.mark.parametrize(("level", "options"), [("O3", {"loss_scale": "dynamic"}), ("O2", {"master_weights": False})],
                         ids=["O3-dynamic", "O2-no-masters"])
def test_float16_weights_stepped_by_the_optimizer_itself_scale_dynamically(level, options):
    """float16 weights the optimizer steps directly (no float32 masters), the loss scaled dynamically (CUDA's default
    dtype). Before: GradScaler raised "Attempting to unscale FP16 gradients." at the first step. (The same through
    run.py: tests/test_e2e.py, under -m bench.)"""
    spec = spec_for(level, "float16", **options)
    assert (spec.loss_scale, spec.master_weights) == ("dynamic", False)
    precision, model, optimizer = prepared(spec)
    assert torch.float16 in {p.dtype for p in model.parameters()}
    before = snapshot(model)
    losses = [one_step(precision, model, optimizer, seed=seed) for seed in range(3)]
    assert all(torch.isfinite(loss) for loss in losses), losses
    assert not any(torch.equal(b, a) for b, a in zip(before, snapshot(model), strict=True) if b.dtype == torch.float16)
    assert precision.state() == {"final_loss_scale": 65536.0, "skipped_steps": 0}


@pytest.mark.parametrize("dtype", HALVES)
def test_o3_has_no_scaler(dtype):
    precision, _, _ = prepared(spec_for("O3", dtype))
    assert precision.scaler is None
    assert precision.state() == {"final_loss_scale": 1.0, "skipped_steps": 0}


def test_o1_bfloat16_has_no_scaler_unless_asked():
    precision, _, _ = prepared(spec_for("O1", "bfloat16"))
    assert precision.scaler is None and precision.state()["final_loss_scale"] == 1.0
    asked, _, _ = prepared(spec_for("O1", "bfloat16", loss_scale="dynamic"))
    assert asked.scaler is not None


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_static_loss_scale_is_divided_out(level):
    """A power-of-two static scale is exact in binary floats: the step must equal the unscaled one."""
    plain, plain_model, plain_opt = prepared(spec_for(level, "bfloat16", loss_scale=1.0))
    scaled, scaled_model, scaled_opt = prepared(spec_for(level, "bfloat16", loss_scale=1024.0))
    assert scaled.scaler is None and scaled.static_scale == 1024.0
    for seed in range(2):
        one_step(plain, plain_model, plain_opt, seed=seed)
        one_step(scaled, scaled_model, scaled_opt, seed=seed)
    for a, b in zip(snapshot(plain_model), snapshot(scaled_model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)
    assert scaled.state() == {"final_loss_scale": 1024.0, "skipped_steps": 0}


# --- O2 under real DDP: replicas stay identical -------------------------------------------------------------

def _ddp_o2_rank(rank: int, world_size: int, store_path: str, out_dir: str) -> None:
    """One gloo rank: TinyCNN, native O2 bfloat16, DDP, 5 steps on data of its own."""
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from harness.launch.launcher import loopback_interface

    os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)  # identical initial weights, as the worker does
        precision = amp_plugin(resolve(AmpConfig(level="O2"), "cpu"))
        model, optimizer = prepare(precision, TinyCNN(num_classes=10), sgd())
        ddp = DistributedDataParallel(precision.wrap_module(model))
        initial = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        losses = [one_step(precision, model, optimizer, seed=100 * rank + step, wrapped=ddp).item()
                  for step in range(5)]
        flat = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        masters = torch.cat([p.detach().flatten() for p in precision._master_params])
        gathered = [torch.empty_like(flat) for _ in range(world_size)]
        dist.all_gather(gathered, flat)
        gathered_masters = [torch.empty_like(masters) for _ in range(world_size)]
        dist.all_gather(gathered_masters, masters)
        report = {
            "rank": rank, "losses": losses,
            "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "moved": float((flat - initial).abs().max()),
            "max_diff": max(float((g - flat).abs().max()) for g in gathered),
            "max_master_diff": max(float((g - masters).abs().max()) for g in gathered_masters),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
        del ddp  # DDP's reducer gone and both ranks past their last collective before the group is torn down:
        dist.barrier()  # a rank that exited first once aborted its neighbour ("terminate called without an active
        # exception", SIGABRT) in a full suite run
    finally:
        dist.destroy_process_group()
    leave_at_once()


@pytest.mark.slow
def test_ddp_o2_keeps_replicas_identical(tmp_path):

    world_size = 2
    start_ranks(_ddp_o2_rank, (world_size, str(tmp_path / "store"), str(tmp_path)), world_size)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]
    for report in reports:
        assert report["dtypes"] == ["torch.bfloat16", "torch.float32"]  # half model, fp32 batch-norm
        assert report["moved"] > 0  # the steps really changed the weights
        assert report["max_diff"] == 0.0, report  # every replica holds the same weights...
        assert report["max_master_diff"] == 0.0, report  # ...and the same fp32 masters
        assert all(math.isfinite(loss) for loss in report["losses"])
    assert reports[0]["losses"] != reports[1]["losses"]  # each rank trained on data of its own


# --- half precision on a CPU without native kernels for it ---------------------------------------------------

@pytest.mark.parametrize("native", [True, False])
def test_half_levels_are_skipped_where_the_cpu_only_emulates_them(monkeypatch, native):
    """An AVX2-only CPU has no oneDNN bfloat16 kernels: O1-O3 would time emulation (30x slower than fp32 for
    resnet18 on such a host). Skipped with the reason, unless asked for; never on CUDA, never at O0. `auto`
    follows the hardware's answer (torch's own check, faked here both ways)."""
    from harness.core import devices

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    monkeypatch.setattr(devices, "cpu_has_native_half", devices.cpu_has_native_half.__wrapped__)  # uncached
    o2 = resolve(AmpConfig(level="O2"), "cpu")
    reason = skip_reason(o2, "cpu")
    if native:
        assert reason is None
    else:
        assert "this CPU (" in reason and "no native bfloat16 kernels" in reason
        assert "amp.allow_emulated=true" in reason
    assert skip_reason(resolve(AmpConfig(level="O2", allow_emulated=True), "cpu"), "cpu") is None
    assert skip_reason(resolve(AmpConfig(level="O0"), "cpu"), "cpu") is None
    assert skip_reason(resolve(AmpConfig(level="O2"), "cuda"), "cuda") is None
    assert devices.cpu_half_kernels("bfloat16") == ("onednn" if native else "aten")


@pytest.mark.parametrize("native", [True, False])
def test_amp_cpu_half_overrides_the_hardware_both_ways(monkeypatch, native):
    """amp.cpu_half=emulated: O1-O3 skipped as on an AVX2 host, on any host, and the kernels are ATen's;
    amp.cpu_half=native: run on any host (the kernels stay what the CPU has)."""
    from harness.core import devices

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    monkeypatch.setattr(devices, "cpu_has_native_half", devices.cpu_has_native_half.__wrapped__)
    emulated = resolve(AmpConfig(level="O1", cpu_half="emulated"), "cpu")
    assert "taken as having no native bfloat16 kernels (amp.cpu_half=emulated)" in skip_reason(emulated, "cpu")
    assert skip_reason(dataclasses.replace(emulated, allow_emulated=True), "cpu") is None
    assert skip_reason(resolve(AmpConfig(level="O1", cpu_half="native"), "cpu"), "cpu") is None
    assert skip_reason(resolve(AmpConfig(level="O1", cpu_half="emulated"), "cuda"), "cuda") is None
    assert devices.cpu_half_kernels("bfloat16", "emulated") == "aten"
    assert devices.cpu_half_kernels("bfloat16", "native") == ("onednn" if native else "aten")  # cannot be given


def test_amp_cpu_half_emulated_turns_onednn_off_for_half_levels_only(monkeypatch):
    """What makes the emulated path real on a host with native kernels: oneDNN off while the run computes in
    half (so convolutions take ATen's kernels, as on an AVX2 host), back on after; O0 and CUDA untouched."""
    from harness.core import devices

    monkeypatch.setattr(devices, "cpu_has_native_half", lambda dtype: True)
    assert torch.backends.mkldnn.enabled
    plugin = NativeAmp(resolve(AmpConfig(level="O2", cpu_half="emulated", allow_emulated=True), "cpu"),
                       torch.device("cpu"))
    with plugin.kernels():
        assert not torch.backends.mkldnn.enabled
    assert torch.backends.mkldnn.enabled
    for spec in (resolve(AmpConfig(level="O0", cpu_half="emulated"), "cpu"),
                 resolve(AmpConfig(level="O2", cpu_half="auto"), "cpu"),
                 resolve(AmpConfig(level="O2", cpu_half="native"), "cpu")):
        with NativeAmp(spec, torch.device("cpu")).kernels():
            assert torch.backends.mkldnn.enabled, spec


def test_a_bad_cpu_half_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^amp.cpu_half=avx2 is not allowed: one of auto, native, emulated$"):
        AmpConfig(level="O1", cpu_half="avx2")


class ArglessZeroGrad(torch.optim.SGD):
    """Like horovod 0.28.1's DistributedOptimizer (horovod/torch/optimizer.py: `def zero_grad(self):` ...
    `return super(self.__class__, self).zero_grad()`) and apex's with master weights: no arguments."""

    def zero_grad(self) -> None:  # type: ignore[override]
        super().zero_grad()


@pytest.mark.parametrize("optimizer_cls", [torch.optim.SGD, ArglessZeroGrad])
def test_zero_grad_drops_gradients_and_takes_wrapping_optimizers(optimizer_cls):
    """Gradients are set to None (no memset each step), and an optimizer whose zero_grad takes no
    arguments works (the trainer used to pass set_to_none=True: a TypeError at iteration 1)."""
    model = nn.Linear(3, 2)
    optimizer = optimizer_cls(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    Amp(resolve(AmpConfig(level="O0"), "cpu"), torch.device("cpu")).zero_grad(optimizer)
    assert all(p.grad is None for p in model.parameters())


# ---- FSDP2's precision comes from the amp plugin (Amp.sharded_precision), not from the level's flags ----

@pytest.mark.parametrize("level, options, reduce, expected", [
    # (cast_model, param_dtype, reduce_dtype, output_dtype, norms_apart)
    ("O0", {}, None, (False, None, None, None, False)),
    ("O1", {}, None, (False, None, None, None, False)),  # autocast per op: the parameters stay fp32
    ("O2", {}, None, (False, torch.bfloat16, torch.float32, torch.float32, True)),  # fp32 shards are the masters
    ("O2", {}, torch.float16, (False, torch.bfloat16, torch.float16, torch.float32, True)),  # comm_hook=fp16
    ("O2", {"master_weights": False}, None, (True, None, None, None, True)),  # no masters: the model cast
    ("O3", {}, None, (True, None, None, None, False)),
    ("O3", {"keep_batchnorm_fp32": True}, torch.bfloat16, (True, None, torch.bfloat16, None, True)),
])
def test_the_amp_plugin_says_what_fsdp_does_in_place_of_its_casting(level, options, reduce, expected):
    from amp.native import NativeAmp

    spec = resolve(AmpConfig(level=level, dtype="bfloat16", **options), "cpu")
    p = NativeAmp(spec, torch.device("cpu")).sharded_precision(reduce)
    assert (p.cast_model, p.param_dtype, p.reduce_dtype, p.output_dtype, p.norms_apart) == expected
