"""FSDP2, ZeRO, DDP communication hooks, gradient accumulation and torch.compile, on CPU with gloo."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import CLI_TIMEOUT_S, TINY, describe, leave_at_once, prepare, run_cli, run_config, start_ranks
from torch import nn

from amp import OptimizerSpec, resolve
from amp.native import NativeAmp
from harness.core.amp_levels import AmpConfig
from harness.core.config import RunConfig
from harness.core.devices import Placement
from harness.core.errors import ConfigError, Incompatible
from harness.core.inputs import images
from harness.core.timing import WindowClock
from harness.memory.footprint import Footprint, footprint, per_rank
from harness.rank.data import SyntheticSource, synthetic_batches
from harness.rank.trainer import train
from strategies.base import RankEnv
from strategies.capabilities import no_sync_for

WORLD, GLOBAL_BATCH, ITERATIONS, SIZE = 2, 8, 6, 8

# (name, strategy class, options, grad_accum): trained by the same two processes one after another
CASES = [
    ("ddp", "strategies.ddp.TorchDDP", {}, 1),
    ("zero", "strategies.zero.ZeroDDP", {}, 1),
    ("fsdp", "strategies.fsdp.FSDP2", {}, 1),
    ("ddp_accum", "strategies.ddp.TorchDDP", {}, 2),
    ("fsdp_accum", "strategies.fsdp.FSDP2", {"blocks": ["features"]}, 2),
    ("allreduce_accum", "strategies.allreduce.ManualAllReduce", {}, 2),
    # every parameter its own bucket: several buckets in flight at once, which made torch's PowerSGD hook issue
    # its chained all-reduces in a different order on each rank under gloo (an abort, seen with resnet18)
    ("ddp_powersgd", "strategies.ddp.TorchDDP", {"comm_hook": "powersgd", "bucket_cap_mb": 1e-6}, 1),
]
LOSSY = {"ddp_powersgd"}  # a low-rank approximation of the gradient: replicas agree, the reference is not met


class NoNorm(nn.Module):
    """No batch-norm: a rank's shard of the batch then gives exactly its share of the full batch's
    gradient, so every data-parallel run must match one process trained on the whole batch."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


# as the worker reads them from conf/optim/: ZeRO gets the class and keywords as they are
sgd = OptimizerSpec(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9})
adamw = OptimizerSpec(torch.optim.AdamW, {"lr": 0.01})


def train_here(strategy: Any, local: int, shard: int, grad_accum: int, optimizer: Any = sgd) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    amp = NativeAmp(resolve(AmpConfig("O0"), "cpu"), torch.device("cpu"))
    model, opt = strategy.setup_module(NoNorm(), amp, optimizer)
    batches = synthetic_batches(2, GLOBAL_BATCH, local, shard, images(SIZE, 10), torch.device("cpu"), 0)
    train(model, opt, amp, SyntheticSource(batches), WindowClock(strategy.synchronize, 0), ITERATIONS, 3, grad_accum=grad_accum,
          no_sync=functools.partial(no_sync_for, strategy, model))
    return model, opt


def rank_main(rank: int, out: str) -> None:
    from hydra.utils import get_class

    torch.set_num_threads(1)
    placement = Placement("cpu", (), (), WORLD, True, ("cpu:0", "cpu:1"), 1, GLOBAL_BATCH)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    for name, target, options, accum in CASES:
        os.environ["MASTER_PORT"] = str(agreed_port(rank, Path(out) / f"{name}.port"))
        strategy = get_class(target)(**options)
        strategy.setup(RankEnv(rank, rank, WORLD, placement, 60))
        try:
            optimizer = adamw if name == "zero" else sgd
            model, opt = train_here(strategy, GLOBAL_BATCH // WORLD, rank, accum, optimizer)
            theory = per_rank(footprint(model, opt), WORLD, strategy.shards)
            torch.save({"params": strategy.full_parameters(model), "theory": theory}, Path(out) / f"{name}{rank}.pt")
        finally:
            strategy.teardown()
    leave_at_once()



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agreed_port(rank: int, file: Path) -> int:
    """Rank 0 picks a free port just before its case and the other rank reads it: ports picked ahead for every
    case were taken by the parallel tests' processes by the time the later cases started (EADDRINUSE)."""
    if rank == 0:
        file.with_suffix(".tmp").write_text(str(free_port()))
        file.with_suffix(".tmp").rename(file)
    deadline = time.monotonic() + 60
    while not file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: no port from rank 0 in {file}")
        time.sleep(0.05)
    return int(file.read_text())


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("modern")
    start_ranks(rank_main, (str(out),), WORLD)
    from strategies.single import SingleDevice

    single = SingleDevice()
    single.setup(RankEnv(0, 0, 1, Placement("cpu", (), (), 1, False, ("cpu",), 1, GLOBAL_BATCH), 60))
    results = {"reference": single.full_parameters(train_here(single, GLOBAL_BATCH, 0, 1)[0]),
               "reference_adamw": single.full_parameters(train_here(single, GLOBAL_BATCH, 0, 1, adamw)[0])}
    for name, *_ in CASES:
        for rank in range(WORLD):
            results[f"{name}{rank}"] = torch.load(out / f"{name}{rank}.pt")
    return results


# One test reads the trained cases (rather than one per case), so that whichever xdist worker runs it trains
# every case once.
@pytest.mark.slow
def test_replicas_agree_match_one_process_and_the_theory_divides_what_is_sharded(trained):
    """Sharded parameters are gathered whole (a rank's local shard would have half the rows); ZeRO's ranks
    each stepped half the parameters, so without its broadcast the replicas would differ; accumulating
    without dividing the loss by N, or without the final all-reduce, would move away from the reference."""
    start = NoNorm().state_dict()
    for name, *_ in CASES:
        reference = trained["reference_adamw" if name == "zero" else "reference"]
        first, second = trained[f"{name}0"]["params"], trained[f"{name}1"]["params"]
        assert list(first) == list(reference), name  # the user's model's names, whatever wraps it
        for key, value in reference.items():
            assert first[key].shape == value.shape, (name, key)
            torch.testing.assert_close(first[key], second[key], rtol=0, atol=0, msg=f"{name} {key}: replicas")
            if name in LOSSY:  # trained, and both ranks the same; not the reference (compressed gradients)
                assert not torch.equal(first[key], start[key]), (name, key)
                continue
            torch.testing.assert_close(first[key], value, rtol=1e-5, atol=1e-6, msg=f"{name} {key}: reference")
            assert not torch.equal(value, start[key])  # training moved it: not agreement at the start

    # the memory theory of the same runs: what each strategy divides by the world size
    # 4*3*9+4 + 6*4*9+6 + 6*10+10 = 112 + 222 + 70 = 404 fp32 parameters = 1616 bytes
    whole = 404 * 4
    ddp, zero, fsdp = (trained[f"{n}0"]["theory"] for n in ("ddp", "zero", "fsdp"))
    assert ddp["whole_bytes"] == {"params": whole, "grads": whole, "optimizer_state": whole, "master_weights": 0}
    assert zero["whole_bytes"]["optimizer_state"] == 2 * whole  # AdamW: two moments per element
    mib = 2**20
    assert ddp["total_mib"] * mib == pytest.approx(3 * whole)
    assert zero["total_mib"] * mib == pytest.approx(2 * whole + 2 * whole / 2)
    assert fsdp["total_mib"] * mib == pytest.approx(3 * whole / 2)


def test_o2_master_weights_are_replicated_unless_parameters_are_sharded():
    whole = Footprint(params=200, grads=200, optimizer_state=400, master_weights=400)
    zero, fsdp = per_rank(whole, 4, (False, False, True)), per_rank(whole, 4, (True, True, True))
    assert zero["total_mib"] * 2**20 == pytest.approx(200 + 200 + 100 + 400)
    assert fsdp["total_mib"] * 2**20 == pytest.approx((200 + 200 + 400 + 400) / 4)


def test_the_theory_counts_the_gradients_alive_at_the_step():
    """Native O2 on tiny_cnn (bfloat16 on CPU): the optimizer steps fp32 master weights with fp32 gradients
    (the model's half ones dropped as each is converted), so the gradients alive at the step are 4 bytes per
    element, not the model's dtype. Elements: conv 3*8*9 = 216, bn 2*8 = 16, conv 8*16*9 = 1152, bn 2*16 = 32,
    linear 16*10+10 = 170: 1586; in the model's dtype 2*(216+1152+170) + 4*(16+32) = 3268 bytes (batch-norm
    kept fp32), as fp32 masters 4*1586 = 6344."""
    from harness.rank.models import TinyCNN

    torch.manual_seed(0)
    amp = NativeAmp(resolve(AmpConfig(level="O2", dtype="bfloat16"), "cpu"), torch.device("cpu"))
    model, optimizer = prepare(amp, TinyCNN(10), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    tensors = [*model.parameters(), *(p for g in optimizer.param_groups for p in g["params"])]
    alive: list[int] = []
    optimizer.register_step_pre_hook(lambda *_: alive.append(
        sum(t.grad.numel() * t.grad.element_size() for t in tensors if t.grad is not None)))
    wrapped = amp.wrap_module(model)
    with amp.forward_context():
        loss = nn.functional.cross_entropy(wrapped(torch.randn(4, 3, 8, 8)), torch.randint(0, 10, (4,)))
    amp.backward(loss)
    amp.step(optimizer)
    whole = footprint(model, optimizer)
    assert (whole.params, whole.master_weights) == (3268, 6344)
    assert whole.grads == alive[0] == 6344  # not 3268: the model's dtype
    # an amp that keeps the model's half gradients beside the masters (apex) holds both
    assert footprint(model, optimizer, model_grads_kept=True).grads == 6344 + 3268


def test_fsdp_gradients_are_whole_while_micro_batches_accumulate():
    """FSDP2 under set_requires_gradient_sync(False) accumulates unsharded gradients: with grad_accum=2 every
    rank holds the whole model's, not a quarter (the parameters and state stay sharded)."""
    whole = Footprint(params=1000, grads=1000, optimizer_state=1000, master_weights=0)
    plain, accumulating = (per_rank(whole, 4, (True, True, True), accum) for accum in (1, 2))
    assert plain["grads_mib"] * 2**20 == pytest.approx(250) and plain["total_mib"] * 2**20 == pytest.approx(750)
    assert accumulating["grads_mib"] * 2**20 == pytest.approx(1000)
    assert accumulating["total_mib"] * 2**20 == pytest.approx(250 + 1000 + 250)
    assert accumulating["sharded"] == {"params": True, "grads": False, "optimizer_state": True}
    zero = per_rank(whole, 4, (False, False, True), 2)  # ZeRO-1 never shards gradients: the same either way
    assert zero["grads_mib"] * 2**20 == pytest.approx(1000)


def run_cfg(name: str, options: dict, **values: object) -> RunConfig:
    """The run's config as check_run sees it: `name`'s yaml with `options` over it."""
    cfg = run_config(name)
    return dataclasses.replace(cfg, strategy={**cfg.strategy, **options}, **values)


def placement() -> Placement:
    return Placement("cpu", (), (), WORLD, True, ("cpu:0", "cpu:1"), 1, GLOBAL_BATCH)


def test_fsdp_refuses_what_it_has_no_faithful_form_for():
    from strategies.fsdp import FSDP2

    o0 = resolve(AmpConfig("O0"), "cpu")
    with pytest.raises(Incompatible, match="no communication hook"):
        FSDP2.check_run(run_cfg("fsdp", {"comm_hook": "powersgd"}), placement(), o0)
    with pytest.raises(Incompatible, match="apex"):
        FSDP2.check_compatible(placement(), resolve(AmpConfig("O2", impl="apex"), "cpu"))
    FSDP2.check_run(run_cfg("fsdp", {"comm_hook": "bf16"}, compile=True, grad_accum=2), placement(), o0)  # allowed


def test_powersgd_start_iteration_below_torchs_minimum_is_refused():
    from strategies.ddp import TorchDDP

    with pytest.raises(ConfigError, match="powersgd_start_iter=1 is not allowed"):
        TorchDDP.check_run(run_cfg("ddp", {"comm_hook": "powersgd", "powersgd_start_iter": 1}), placement(),
                           resolve(AmpConfig("O0"), "cpu"))


class ResidualLike(nn.Module):
    """Batch-norm inside the same FSDP unit as a convolution, as in a ResNet block (tiny_cnn makes every
    layer a unit of its own, which never mixed dtypes in one unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()),
                                      nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU()),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


# half weights stepped by the optimizer, batch-norm kept fp32: FSDP2's units must each hold one dtype
MIXED = {"o3_fp32_norm": AmpConfig("O3", keep_batchnorm_fp32=True), "o2_no_masters": AmpConfig("O2", master_weights=False)}


def mixed_rank_main(rank: int, out: str) -> None:
    from strategies.fsdp import FSDP2, sharded_units

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(agreed_port(rank, Path(out) / "mixed.port"))
    strategy = FSDP2()  # one process group; a model per level
    strategy.setup(RankEnv(rank, rank, WORLD, placement(), 60))
    try:
        for name, level in MIXED.items():
            torch.manual_seed(0)
            initial = {n: p.detach().clone() for n, p in ResidualLike().named_parameters()}
            torch.manual_seed(0)
            amp = NativeAmp(resolve(level, "cpu"), torch.device("cpu"))
            model, opt = strategy.setup_module(ResidualLike(), amp, sgd)
            dtypes = {n: p.dtype for n, p in model.module.named_parameters()}
            batches = synthetic_batches(2, GLOBAL_BATCH, GLOBAL_BATCH // WORLD, rank, images(SIZE, 10), torch.device("cpu"), 0)
            train(model, opt, amp, SyntheticSource(batches), WindowClock(strategy.synchronize, 0), 4, 2)
            torch.save({"units": sharded_units(model.module), "dtypes": dtypes, "initial": initial,
                        "params": strategy.full_parameters(model)}, Path(out) / f"{name}{rank}.pt")
    finally:
        strategy.teardown()
    leave_at_once()


@pytest.mark.slow
def test_fsdp_shards_fp32_batchnorm_apart_from_the_half_convolution_beside_it(tmp_path):
    """Before: the first forward raised "FSDP expects uniform original parameter dtype but got
    {torch.bfloat16, torch.float32}" (features.0's unit) at O3 with keep_batchnorm_fp32."""
    start_ranks(mixed_rank_main, (str(tmp_path),), WORLD)
    for name in MIXED:
        ranks = [torch.load(tmp_path / f"{name}{r}.pt") for r in range(WORLD)]
        first = ranks[0]
        assert {"features.0", "features.0.1", "features.1", "features.1.1", ""} <= set(first["units"]), name
        # the wrong-but-plausible way to make a unit uniform is to cast the batch-norm to half too
        assert first["dtypes"]["features.0.0.weight"] == torch.bfloat16, name
        assert first["dtypes"]["features.0.1.weight"] == torch.float32, name
        assert first["dtypes"]["classifier.weight"] == torch.bfloat16, name
        for key in ("features.0.0.weight", "features.0.1.weight", "features.1.1.bias", "classifier.weight"):
            assert torch.equal(ranks[1]["params"][key], first["params"][key]), (name, key)  # replicas agree
            assert not torch.equal(first["params"][key], first["initial"][key].to(first["dtypes"][key]).float()), \
                (name, key)  # and trained


@pytest.mark.parametrize("strategy", ["ddp", "zero"])
def test_powersgd_with_dynamic_loss_scaling_is_refused(strategy):
    """torch's PowerSGD hook folds its stored error into each gradient and stores the new error from it: one
    overflow the scaler skips leaves inf/NaN there for good, and every later step is skipped too."""
    from hydra.utils import get_class

    cls = get_class(run_config(strategy).strategy["_target_"])
    float16_o1 = resolve(AmpConfig("O1", dtype="float16"), "cpu")  # what O1 resolves to on CUDA
    with pytest.raises(Incompatible, match=r"strategy.comm_hook=powersgd is not allowed: none, fp16 or bf16 with "
                                           r"dynamic loss scaling \(O1 float16"):
        cls.check_run(run_cfg(strategy, {"comm_hook": "powersgd"}), placement(), float16_o1)
    cls.check_run(run_cfg(strategy, {"comm_hook": "bf16"}), placement(), float16_o1)  # no error feedback
    for scaled_by_hand in (AmpConfig("O1"), AmpConfig("O1", dtype="float16", loss_scale=1024)):  # bf16: no scaling
        cls.check_run(run_cfg(strategy, {"comm_hook": "powersgd"}), placement(), resolve(scaled_by_hand, "cpu"))


@pytest.mark.parametrize("override, message", [
    ("strategy.comm_hook=nosuch", "strategy.comm_hook=nosuch is not allowed: one of none, fp16, bf16, powersgd"),
    ("grad_accum=0", "grad_accum=0 is not allowed: an integer >= 1"),
    ("compile=maybe", "compile=maybe is not allowed: true or false"),
    ("grad_accum=3", "grad_accum=3 is not allowed: a divisor of each process's batch of 4"),
])
def test_bad_values_are_refused_in_one_line(override, message, capsys):
    from harness import cli

    with pytest.raises(SystemExit) as info:
        cli.precheck(["strategy=ddp", *TINY, override])
    assert info.value.code == cli.EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


@pytest.mark.parametrize("dtype", ["auto", "float16"])  # float16: O1 as on CUDA, with dynamic loss scaling
def test_the_modern_sweep_has_every_combination_and_skips_what_it_cannot_run(dtype, capsys):
    from harness.compose import combinations, compose_one, hydra_context
    from harness.launch.decide import run_plan as plan
    from harness.launch.placement import probe_hardware

    refused = []
    with hydra_context():  # what `run.py -m sweep=modern` composes and checks before it starts
        runs = combinations(["sweep=modern", *TINY, f"amp.dtype={dtype}"], multirun=True)
        for run in runs:
            try:
                plan(compose_one(run).run, probe_hardware(), in_sweep=True)
            except Incompatible:
                refused.append(" ".join(sorted(o for o in run if o.startswith(("strategy", "compile", "amp=")))))
    assert len(runs) == 3 * 4 * 2 * 2  # strategy x comm_hook x compile x amp
    fsdp = [f"amp={a} compile={c} strategy.comm_hook=powersgd strategy=fsdp" for a in ("O0", "O1")
            for c in ("False", "True")]
    scaled = [f"amp=O1 compile={c} strategy.comm_hook=powersgd strategy={s}" for s in ("ddp", "zero")
              for c in ("False", "True")]  # PowerSGD's error feedback and dynamic loss scaling
    assert sorted(refused) == sorted(fsdp + (scaled if dtype == "float16" else []))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    proc, results = run_cli("strategy=fsdp", "compile=true", "grad_accum=2", "strategy.comm_hook=bf16", *TINY,
                            "iterations=20", "log_every=10", tmp_path=tmp_path_factory.mktemp("compiled"),
                            timeout=3 * CLI_TIMEOUT_S)  # torch.compile (inductor, gcc) on top of a normal run
    assert proc.returncode == 0 and results is not None, describe(proc)
    return results


@pytest.mark.slow
def test_compiled_run_times_compilation_apart_and_the_report_labels_it(compiled, tmp_path):
    from harness.report.rows import build_rows

    windows = compiled["windows"]
    assert compiled["status"] == "ok" and compiled["compile"] is True and compiled["grad_accum"] == 2
    # compiling took longer than every timed window together: it cannot have been inside one
    assert compiled["compile_seconds"] > windows[-1]["cumulative_seconds"]
    assert compiled["startup_seconds"] < compiled["command_startup_seconds"]
    assert compiled["variant"] == "comm_hook=bf16 compile grad_accum=2"
    # throughput counts images: global batch x steady iterations / steady seconds, whatever grad_accum
    steady = [w for w in windows if not w["warmup"]]
    assert compiled["throughput_img_s"] == pytest.approx(8 * 10 * len(steady) / sum(w["seconds"] for w in steady))
    # grad_accum=2: FSDP2 accumulates on unsharded gradients, so the theory does not divide them
    assert compiled["memory_theory"]["sharded"] == {"params": True, "grads": False, "optimizer_state": True}
    rows, _ = build_rows([(tmp_path / "results.json", {k: v for k, v in compiled.items() if k != "_run_dir"})])
    assert rows[0].label == "fsdp O0 comm_hook=bf16 compile grad_accum=2"
    assert rows[0].median(lambda run: run.compile_seconds) == compiled["compile_seconds"]
    assert rows[0].memory.theory_mib == compiled["memory_theory"]["total_mib"]
    # inductor's output went to the named folder (not /tmp/torchinductor_<user>): it holds files now
    cache = Path(compiled["compile_cache"]["dir"])
    assert compiled["compile_cache"]["warm"] in (True, False) and any(cache.rglob("*.py")), compiled["compile_cache"]


def test_fsdp_compiles_a_second_shape_static_not_symbolic(monkeypatch):
    """A ResNet's blocks share one forward at different widths, and FSDP2's hooks make each block a frame of its
    own: with dynamo's automatic dynamic shapes the second width recompiled with symbolic sizes, whose backward
    inductor failed on (resnet18, torch 2.15.0: "InductorError: TypeError: Cannot convert expression to float").
    The same recompilation, seen by a backend that records its inputs' sizes: a Linear called with 2 then 3 rows
    (ints both times; automatic dynamic would make the second a SymInt)."""
    from strategies.fsdp import FSDP2

    seen: list[list[Any]] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:  # the traced (fake) inputs' sizes
        values = [n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder")]
        seen.append([size for v in values if isinstance(v, torch.Tensor) for size in v.shape]
                    + [v for v in values if isinstance(v, torch.SymInt)])
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend=backend, **kw))
    torch._dynamo.reset()
    try:
        compiled = FSDP2().compile(nn.Linear(4, 2))
        compiled(torch.randn(2, 4))
        compiled(torch.randn(3, 4))
    finally:
        torch._dynamo.reset()
    assert len(seen) == 2 and all(isinstance(s, int) for sizes in seen for s in sizes), seen
    assert seen[1][-2:] == [3, 4]


def test_powersgd_keeps_its_plain_iterations_after_the_compile_pass(monkeypatch):
    """The compile pass's backward runs DDP's comm hook, which PowerSGD counts as a training iteration
    (PowerSGDState.maybe_increase_iter: `self.iter += 1` at the last bucket): the strategy puts it back, so the
    timed run still gets powersgd_start_iter (2) plain all-reduces; without it, 1 is left."""
    from harness.rank.trainer import compile_pass
    from strategies.ddp import TorchDDP

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    strategy = TorchDDP(comm_hook="powersgd", powersgd_start_iter=2)
    strategy.setup(RankEnv(0, 0, 1, Placement("cpu", (), (), 1, True, ("cpu:0",), 1, 4), 60))
    try:
        amp = NativeAmp(resolve(AmpConfig("O0"), "cpu"), torch.device("cpu"))
        model, opt = strategy.setup_module(NoNorm(), amp, sgd)
        batch = (torch.randn(4, 3, SIZE, SIZE), torch.tensor([0, 1, 2, 3]))
        state = strategy.powersgd_state
        assert state is not None
        compile_pass(model, amp, opt, batch, 1, contextlib.nullcontext)  # the hook counted the pass
        assert state.iter == 1
        state.iter = 0
        compile_pass(model, amp, opt, batch, 1, contextlib.nullcontext, strategy.after_compile_pass)
        assert state.iter == 0
    finally:
        strategy.teardown()


def test_compile_cache_is_a_named_folder_and_says_whether_it_was_warm(tmp_path, monkeypatch):
    """compile=true's cache: runs/compile-cache (relative to where the command runs) unless TORCHINDUCTOR_CACHE_DIR
    names one; exported for the workers; `warm` says whether an earlier run had left anything in it."""
    from harness.core.compile_cache import prepare_compile_cache, torch_default

    monkeypatch.chdir(tmp_path)
    # what importing torch._dynamo exports by itself: not the user's choice
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(torch_default()))
    first = prepare_compile_cache()
    assert first == {"dir": str(tmp_path / "runs" / "compile-cache"), "warm": False}
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == first["dir"]
    (tmp_path / "runs" / "compile-cache" / "fxgraph").mkdir()
    assert prepare_compile_cache()["warm"] is False  # an empty subfolder is no cache
    (tmp_path / "runs" / "compile-cache" / "fxgraph" / "graph").write_text("compiled")
    assert prepare_compile_cache()["warm"] is True
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert prepare_compile_cache() == {"dir": str(tmp_path / "mine"), "warm": False}
