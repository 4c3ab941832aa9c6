"""`python run.py -m search=true plan=true plan.hardware=<preset>` (harness/search/preset.py, harness.cli's
search_on_preset): a layout found without running. With the preset's predictions made by hand (predict_on faked):
the fastest candidate that fits is the answer and the second fastest the runner-up, what does not fit is pruned with
its reason, a micro-batch larger than one that does not fit is pruned without its prediction, and so is one smaller
than the largest that fits (found by bisection; a pipeline's are all predicted), nothing is launched, and the
command that trains the winner reproduces it without the search's keys. The space holds tensor parallelism (fsdp at
TP 2, strategy=tp over the node; fsdp at the node's width on several nodes) and pipelines (pp at its microbatch
counts). Then real searches, in-process through run.py: a tiny GPT on h100x8, and Llama 3 8B there, where FSDP x TP
is the answer."""

from __future__ import annotations

import json
import math
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from harness import cli
from harness.core.config import RunConfig
from harness.prediction.predict import Prediction, RankMemory
from harness.search import preset
from harness.search.space import key_of

PRESET_SEARCH = ("-m", "search=true", "plan=true", "plan.hardware=h100x8", "model=gpt")
DEVICE_MIB = 1000.0


def prediction(s_per_iteration: float, peak_mib: float, global_batch: int = 128) -> dict[str, Any]:
    """A hand-made prediction on an 8-GPU preset, as predict_on's row holds it."""
    ranks = tuple(RankMemory(f"cuda:{i}", peak_mib, 0, 0, 0, 0, 0, 0) for i in range(8))
    return Prediction(hardware="h100x8", world_size=8, ranks=ranks, device_memory_mib=DEVICE_MIB, shared_memory=False,
                      compute_s=s_per_iteration, optimizer_s=0, comm_s=0, exposed_comm_s=0, flops_per_iteration=1,
                      global_batch=global_batch, assumptions=("made by hand",),
                      time_band=(0.8, 1.25)).as_dict()


# seconds an iteration at O0 and one micro-step, and MiB a sample of a micro-batch holds at width 64 (fsdp tp=2 as
# its own strategy); the device has DEVICE_MIB
BASE = {"fsdp": 0.9, "fsdp tp=2": 0.95, "ddp": 1.0, "zero": 1.1, "tp": 1.2, "pp": 1.3}
PER_SAMPLE = {"fsdp": 50.0, "fsdp tp=2": 40.0, "ddp": 110.0, "zero": 600.0, "tp": 30.0, "pp": 20.0}


def made_by_hand(cfg: RunConfig) -> tuple[float, float]:
    """(seconds an iteration, peak MiB) of a candidate on 8 GPUs. A rank's micro-batch, of a global batch of 128:
    16 / grad_accum samples (ddp, zero, fsdp), 32 / grad_accum (fsdp tp=2: 4 groups of 2 ranks share the batch), 128 /
    grad_accum (tp: one group, the whole batch), 128 / microbatches (pp). Memory is PER_SAMPLE a sample of it, and
    grows with the model's width (64 by default). Time: BASE, by 0.8 at O1; each halving of the micro-batch costs 10 %
    (1 + 0.1 log2 grad_accum), except a pipeline's, whose idle share (p - 1) / (m + p - 1) shrinks with more
    microbatches m (1 + 7 / (m + 7))."""
    name = cfg.strategy_name + (f" tp={cfg.strategy['tp']}" if cfg.strategy.get("tp", 1) != 1 else "")
    if name == "pp":
        micro = cfg.batch_size // cfg.strategy["microbatches"]
        steps = 1 + 7 / (cfg.strategy["microbatches"] + 7)
    else:
        group = {"fsdp tp=2": 2, "tp": 8}.get(name, 1)  # ranks sharing one share of the batch
        micro = cfg.batch_size // (8 // group) // cfg.grad_accum
        steps = 1 + 0.1 * math.log2(cfg.grad_accum)
    seconds = BASE[name] * (0.8 if cfg.amp.level == "O1" else 1.0) * steps
    return seconds, PER_SAMPLE[name] * micro * cfg.model["width"] / 64


@pytest.fixture
def faked(monkeypatch, tmp_path):
    """predict_on made by hand (each call recorded); everything that would start a worker, a fork server, the
    local checks or Hydra's sweep fails the test; runs/ lands in tmp_path."""
    calls: list[RunConfig] = []

    def predict_on(cfg: RunConfig, hardware: str, cores: int, measure_link: Any = None) -> dict[str, Any]:
        assert hardware == "h100x8" and measure_link is None
        calls.append(cfg)
        seconds, peak = made_by_hand(cfg)
        p = prediction(seconds, peak)
        return {"strategy": cfg.strategy_name, "amp": cfg.amp.level, "model": "gpt", "variant": "",
                "hardware": hardware, "global_batch": cfg.batch_size, "status": "predicted", "world_size": 8,
                "reason": p["misfit"], "prediction": p}

    def launched(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a search on a preset launches nothing")

    monkeypatch.setattr("harness.launch.on_preset.predict_on", predict_on)
    for entry in ("harness.cli.check_runs", "harness.search.shortlist.settle", "harness.launch.launcher.launch_workers",
                  "harness.launch.launcher.preload_forkserver", "harness.launch.runner.execute", "hydra.main"):
        monkeypatch.setattr(entry, launched)
    monkeypatch.chdir(tmp_path)
    return calls


def search(*overrides: str) -> int:
    with pytest.raises(SystemExit) as stopped:
        cli.precheck([*PRESET_SEARCH, *overrides])  # returning would hand the command line to Hydra
    return stopped.value.code


def plan_of(folder: Path) -> tuple[dict[str, Any], str]:
    (path,) = (folder / "runs" / "plan").glob("*/plan.json")
    return json.loads(path.read_text()), (path.parent / "plan.md").read_text()


def test_the_fastest_fitting_prediction_wins_and_what_does_not_fit_is_pruned(faked, tmp_path, capsys):
    """By hand (made_by_hand), each group of candidates that differ only in their micro-batch, smallest first (the
    most micro-steps), fits up to some index; bisection finds it, probing the middle (O0), then on either side of the
    boundary the same group at O0 found (O1):
    ddp [16 8 4 2 | 1]: O0 probes 4 (fits), 1 (no), 2 (fits); O1 probes 1 (no), 2 (fits).
    zero [16 | 8 4 2 1]: O0 probes 4 (no), 8 (no), 16 (fits); O1 probes 8 (no), 16 (fits).
    fsdp [16 8 4 2 1 |]: O0 probes 4, 1 (both fit); O1 probes 1 (fits).
    fsdp tp=2 [32 16 8 4 2 | 1]: O0 probes 4 (fits), 1 (no), 2 (fits); O1 probes 1 (no), 2 (fits).
    tp [128 64 32 16 8 4 | 2 1]: O0 probes 8 (fits), 2 (no), 4 (fits); O1 probes 2 (no), 4 (fits).
    pp, microbatches [128 64 32 16 8 |]: every one predicted at O0 and at O1 (10).
    33 predictions of 68 candidates; the ones probed below a group's largest fit are pruned with the rest."""
    code = search("model.width=64", "model.seq_len=64", "search.axes=[strategy,amp,micro_batch]")
    out = capsys.readouterr().out
    assert code == 0, out
    data, text = plan_of(tmp_path)
    rows = data["rows"]
    # 2 amp levels x (ddp 5, zero 5, fsdp 5, fsdp tp=2 6, tp 8 grad_accum values; pp 5 microbatch counts)
    assert len(rows) == 68 and len(faked) == 33
    predicted = sorted((c.strategy_name, c.strategy.get("tp", 1), c.amp.level, c.grad_accum) for c in faked
                       if c.strategy_name != "pp")
    assert predicted == sorted([
        ("ddp", 1, "O0", 4), ("ddp", 1, "O0", 1), ("ddp", 1, "O0", 2), ("ddp", 1, "O1", 1), ("ddp", 1, "O1", 2),
        ("zero", 1, "O0", 4), ("zero", 1, "O0", 8), ("zero", 1, "O0", 16), ("zero", 1, "O1", 8), ("zero", 1, "O1", 16),
        ("fsdp", 1, "O0", 4), ("fsdp", 1, "O0", 1), ("fsdp", 1, "O1", 1), ("fsdp", 2, "O0", 4), ("fsdp", 2, "O0", 1),
        ("fsdp", 2, "O0", 2), ("fsdp", 2, "O1", 1), ("fsdp", 2, "O1", 2), ("tp", 1, "O0", 8), ("tp", 1, "O0", 2),
        ("tp", 1, "O0", 4), ("tp", 1, "O1", 2), ("tp", 1, "O1", 4)])
    assert len([c for c in faked if c.strategy_name == "pp"]) == 10
    answer = data["search"]
    # fsdp O1 at one micro-step: 0.9 x 0.8 = 0.72 s; then fsdp tp=2 O1 at 2: 0.95 x 0.8 x 1.1 = 0.836 s
    assert answer["winner"]["name"] == "fsdp O1 bf16 grad_accum=1"
    assert answer["runner_up"]["name"] == "fsdp O1 bf16 tp=2 grad_accum=2"
    assert answer["winner"]["s_per_iteration"] == pytest.approx(0.72)
    # ranked: one a group (the largest micro-batch that fits), every pp microbatch count: 10 + 10 of 68
    assert answer["predicted_to_fit"] == 20
    assert answer["pruned_by_reason"] == {"predicted not to fit": 9, preset.LARGER_MICRO: 7, preset.SMALLER_MICRO: 32}
    misfits = {p["name"]: p["reason"] for p in answer["pruned"] if p["why"] == "predicted not to fit"}
    assert set(misfits) == {"ddp O0 grad_accum=1", "ddp O1 bf16 grad_accum=1", "zero O0 grad_accum=4",
                            "zero O0 grad_accum=8", "zero O1 bf16 grad_accum=8", "fsdp O0 tp=2 grad_accum=1",
                            "fsdp O1 bf16 tp=2 grad_accum=1", "tp O0 grad_accum=2", "tp O1 bf16 grad_accum=2"}
    assert misfits["zero O0 grad_accum=8"].startswith("predicted peak 1.2 GiB > 1.0 GiB on cuda:0")
    larger = {p["name"]: p["reason"] for p in answer["pruned"] if p["why"] == preset.LARGER_MICRO}
    assert larger["zero O1 bf16 grad_accum=1"] == "zero O1 bf16 grad_accum=8"
    smaller = {p["name"]: p["reason"] for p in answer["pruned"] if p["why"] == preset.SMALLER_MICRO}
    assert smaller["fsdp O1 bf16 grad_accum=16"] == "fsdp O1 bf16 grad_accum=1"
    assert smaller["ddp O0 grad_accum=4"] == "ddp O0 grad_accum=2"  # probed on the way: its prediction kept, unranked
    probed = next(r for r in rows if r["name"] == "ddp O0 grad_accum=4")
    assert probed["status"] == "pruned" and probed["prediction"]["fits"]
    # the winner's command: its overrides as typed and searched, no search/plan/sweep key, bfloat16 autocast
    command = answer["winner"]["command"]
    assert command == ("python run.py model=gpt model.width=64 model.seq_len=64 strategy=fsdp amp=O1 amp.dtype=bfloat16 "
                       "grad_accum=1")
    assert not [w for w in command.split()[2:] if key_of(w).partition(".")[0] in ("search", "plan", "sweep", "hydra")]
    winner = next(r for r in rows if r["name"] == answer["winner"]["name"])
    assert command.split()[2:] == [o for o in winner["overrides"] if key_of(o).partition(".")[0] not in
                                   ("search", "plan", "sweep", "hydra")]
    assert preset.command(next(r["overrides"] for r in rows if r["name"] == "fsdp O1 bf16 tp=2 grad_accum=2")) == (
        "python run.py model=gpt model.width=64 model.seq_len=64 strategy=fsdp strategy.tp=2 amp=O1 "
        "amp.dtype=bfloat16 grad_accum=2")
    assert preset.command(next(r["overrides"] for r in rows if r["name"] == "pp O1 bf16 microbatches=128")) == (
        "python run.py model=gpt model.width=64 model.seq_len=64 strategy=pp strategy.microbatches=128 amp=O1 "
        "amp.dtype=bfloat16")
    # tokens/s: 64 tokens a sample, 128 samples in 0.72 s
    assert answer["winner"]["unit"] == "tokens/s" and answer["winner"]["rate"] == pytest.approx(128 / 0.72 * 64)
    assert answer["winner"]["rate_band"] == pytest.approx([128 / 0.9 * 64, 128 / 0.576 * 64])
    for said in (out, text):
        assert "Fastest predicted: fsdp O1 bf16 grad_accum=1: 11,378 tokens/s (90 % band 9,102–14,222)" in said
        assert "Runner-up: fsdp O1 bf16 tp=2 grad_accum=2: 9,799 tokens/s" in said and "; the winner is 1.16x as fast" \
            in said
        assert ("Pruned 48 of 68: 9 predicted not to fit, 7 larger micro-batch than one that does not fit, 32 smaller "
                "micro-batch than the largest that fits") in said
        assert f"Train it on h100x8: {command}" in said
    assert "search: 1/68 ddp O0 grad_accum=4: predicted (" in out
    assert "zero O0 grad_accum=1: pruned: larger micro-batch than one that does not fit (zero O0 grad_accum=8)" in out
    assert "fsdp O1 bf16 grad_accum=2: pruned: smaller micro-batch than the largest that fits (fsdp O1 bf16 " \
        "grad_accum=1)" in out
    assert not (tmp_path / "runs" / "multirun").exists()


def test_the_same_config_is_predicted_once(faked, tmp_path, capsys):
    """Two candidates that compose the same config (a value typed twice, spelled two ways): one prediction."""
    assert search("search.axes=[amp]", "strategy=fsdp", "strategy.tp=1", "grad_accum=2",
                  "model.layers=2,int(2.0)") == 0
    data, _ = plan_of(tmp_path)
    assert len(data["rows"]) == 2 * 2 and len(faked) == 2
    same = [r for r in data["rows"] if r["status"] == "pruned"]
    assert len(same) == 2 and all(r["reason"].startswith(preset.SAME) for r in same)


def preset_space(*extra: str, hardware: str = "h100x8", model: str = "gpt") -> preset.Space:
    """The space of `search=true plan=true plan.hardware=<hardware> model=<model> <extra>`, nothing predicted."""
    from harness.compose import compose_one, hydra_context

    overrides = [cli.plan_shorthand(o) for o in ("search=true", "plan=true", f"plan.hardware={hardware}",
                                                  f"model={model}", *extra)]
    with hydra_context():
        return preset.preset_space(overrides, compose_one(overrides).run)


def values_of(found: preset.Space, key: str, where: str | None = None) -> list[str]:
    """The values `key` takes across the candidates (those holding the override `where`), in numeric order."""
    return sorted({o.partition("=")[2] for c in found.candidates if where is None or where in c for o in c
                   if key_of(o) == key}, key=lambda v: (len(v), v))


def test_the_axes_on_a_gpu_preset():
    """Unless search.axes is typed: ddp, zero, fsdp (also at TP 2), tp, pp; O0 and O1 as bfloat16; every power-of-two
    micro-batch of a rank's share of the 128 samples (16 a rank; 32 a pair of fsdp tp=2; all 128 for tp over the
    node), a pipeline's microbatches in place of grad_accum (the batch cut in 8 to 128: at least its 8 stages); the
    model's own checkpointing values; no compile, no comm_hook, no bucket."""
    from harness.core.options import option_choices

    found = preset_space()
    checkpoint = option_choices("harness.rank.gpt.GPT", "checkpoint")
    assert checkpoint is not None
    # (ddp 5 + zero 5 + fsdp 5 + fsdp tp=2 6 + tp 8 grad_accum values + pp 5 microbatch counts) x 2 amp x checkpoint
    assert len(found.candidates) == (5 + 5 + 5 + 6 + 8 + 5) * 2 * len(checkpoint) == 204
    keys = {key_of(o) for c in found.candidates for o in c}
    assert not keys & {"compile", "strategy.comm_hook", "strategy.bucket_cap_mb", "strategy.replicate"}
    values = {k: sorted({o.partition("=")[2] for c in found.candidates for o in c if key_of(o) == k})
              for k in ("strategy", "amp", "model.checkpoint", "amp.dtype", "strategy.tp")}
    assert values == {"strategy": ["ddp", "fsdp", "pp", "tp", "zero"], "amp": ["O0", "O1"],
                      "model.checkpoint": sorted(checkpoint), "amp.dtype": ["bfloat16"], "strategy.tp": ["2"]}
    assert values_of(found, "grad_accum", "strategy=ddp") == ["1", "2", "4", "8", "16"]
    assert values_of(found, "grad_accum", "strategy.tp=2") == ["1", "2", "4", "8", "16", "32"]
    assert values_of(found, "grad_accum", "strategy=tp") == ["1", "2", "4", "8", "16", "32", "64", "128"]
    pipelines = [c for c in found.candidates if "strategy=pp" in c]
    assert values_of(found, "strategy.microbatches") == ["8", "16", "32", "64", "128"]
    assert not [c for c in pipelines if any(key_of(o) == "grad_accum" for o in c)]  # its microbatches instead
    assert not [c for c in found.candidates if "strategy=pp" not in c and any("microbatches" in o for o in c)]
    assert all(("amp=O1" in c) == ("amp.dtype=bfloat16" in c) for c in found.candidates)
    by_name = dict(zip(found.names, found.candidates, strict=True))
    assert preset.command(by_name["fsdp O1 bf16 tp=2 grad_accum=32 model.checkpoint=none"]) == (
        "python run.py model=gpt strategy=fsdp strategy.tp=2 amp=O1 amp.dtype=bfloat16 grad_accum=32 "
        "model.checkpoint=none")
    assert preset.command(by_name["pp O0 microbatches=8 model.checkpoint=full"]) == (
        "python run.py model=gpt strategy=pp strategy.microbatches=8 amp=O0 model.checkpoint=full")
    assert "tensor parallel (strategy.tp): fsdp also at TP 2 within a node; tp: TP over the node's 8 GPUs" in found.axes
    assert "pipeline microbatches (strategy.microbatches): 8, 16, 32, 64, 128, in place of grad_accum" in found.axes
    assert found.largest_fit


def test_the_tp_degrees_stay_within_a_node():
    """fsdp at TP 1, 2 and the node's width, each a divisor of the node's GPUs; on one node the node's width is
    strategy=tp's, searched once (as fsdp's where strategy=tp is not a candidate)."""
    h100x8 = preset.load_preset("h100x8")
    assert preset.tp_degrees(h100x8, 1, plain_tp=True) == ("1", "2")
    assert preset.tp_degrees(h100x8, 1, plain_tp=False) == ("1", "2", "8")
    assert preset.tp_degrees(h100x8, 2, plain_tp=False) == ("1", "2", "8")
    assert preset.tp_degrees(preset.load_preset("a10x4"), 1, plain_tp=False) == ("1", "2", "4")
    found = preset_space("strategy=fsdp", "search.axes=[amp]")
    assert sorted(found.names) == ["fsdp O0", "fsdp O0 tp=2", "fsdp O0 tp=8", "fsdp O1 bf16", "fsdp O1 bf16 tp=2",
                                   "fsdp O1 bf16 tp=8"]
    typed = preset_space("strategy=fsdp", "strategy.tp=4", "search.axes=[amp]")  # the user's degree, alone
    assert len(typed.candidates) == 2 and all("strategy.tp=4" in c for c in typed.candidates)


def test_on_more_than_one_node_fsdp_is_also_searched_sharded_within_each_node():
    """plan.nodes=2: every fsdp candidate without TP also as HSDP with one replica a node (strategy.replicate=2),
    named so and trained by its command; plain fsdp is spelled without the option, ddp and zero are as they were; TP
    within a node (fsdp at TP 2 and 8), never HSDP x TP, and no strategy=tp (its groups would span the nodes); pp
    at its fewest microbatches without the micro_batch axis (the 16 stages). A typed strategy.replicate is the
    user's: no second candidate."""
    def candidates(*extra: str, nodes: int = 2) -> preset.Space:
        return preset_space(f"plan.nodes={nodes}", "search.axes=[strategy,amp]", *extra)

    found = candidates()
    by_name = dict(zip(found.names, found.candidates, strict=True))
    assert sorted(by_name) == sorted(f"{strategy} {amp}{variant}" for amp in ("O0", "O1 bf16") for strategy, variant in (
        ("ddp", ""), ("zero", ""), ("fsdp", ""), ("fsdp", " replicate=2"), ("fsdp", " tp=2"), ("fsdp", " tp=8"),
        ("pp", " microbatches=16")))
    assert "strategy.replicate=2" in by_name["fsdp O1 bf16 replicate=2"]
    assert not [c for c in found.candidates if "strategy.replicate=1" in c or "strategy.tp=1" in c]
    assert not [c for c in found.candidates if "strategy=fsdp" not in c and "strategy.replicate=2" in c]
    assert not [c for c in found.candidates if "strategy.replicate=2" in c and any("strategy.tp" in o for o in c)]
    assert any("HSDP (strategy.replicate=2)" in said for said in found.axes)
    assert "tensor parallel (strategy.tp): fsdp also at TP 2, 8 within a node" in found.axes
    assert preset.command(by_name["fsdp O0 replicate=2"]) == "python run.py model=gpt strategy=fsdp " \
        "strategy.replicate=2 amp=O0"
    assert preset.command(by_name["fsdp O0"]) == "python run.py model=gpt strategy=fsdp amp=O0"
    assert preset.command(by_name["fsdp O0 tp=8"]) == "python run.py model=gpt strategy=fsdp strategy.tp=8 amp=O0"
    typed = candidates("strategy=fsdp", "strategy.replicate=2", "strategy.tp=1")
    assert len(typed.candidates) == 2 and all("strategy.replicate=2" in c for c in typed.candidates)
    # one node: nothing to replicate across; tp over the node, fsdp at TP 2 beside it
    assert len(candidates(nodes=1).candidates) == 2 * 6


def test_a_space_where_nothing_fits_is_one_line_and_exit_2(faked, tmp_path, capsys):
    code = search("strategy=zero", "amp=O0", "search.axes=[micro_batch]", "batch_size=256", "model.width=128")
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == cli.EXIT_BAD_INPUT and len(lines) == 1, lines
    assert lines[0].startswith("error: search=true is not allowed: a space with a combination predicted to fit on "
                               "h100x8: none of the 6 does (3 predicted not to fit, 3 larger micro-batch than one that "
                               "does not fit; e.g. predicted peak"), lines
    # bisection over grad_accum [32 16 8 4 2 1]: 4, 16, then 32 (1 sample) do not fit: nothing larger is predicted
    assert sorted(c.grad_accum for c in faked) == [4, 16, 32]


def test_without_multirun_it_is_one_line(faked, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.precheck(list(PRESET_SEARCH[1:]))
    lines = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == cli.EXIT_BAD_INPUT and lines == [
        "error: search=true is not allowed: with -m: a search predicts many combinations (python run.py -m search=true "
        "plan=true plan.hardware=h100x8 ...)"]
    assert not faked


def run_py(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *overrides: str) -> int:
    """run.py itself, in-process, in tmp_path, with everything that would launch a run failing the test."""
    def launched(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a search on a preset launches nothing")

    for entry in ("harness.cli.check_runs", "harness.launch.launcher.launch_workers", "harness.launch.runner.execute"):
        monkeypatch.setattr(entry, launched)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["run.py", *overrides])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(REPO / "run.py"), run_name="__main__")
    return stopped.value.code


def test_a_tiny_gpt_searched_on_h100x8_end_to_end(tmp_path, monkeypatch, capsys):
    """run.py itself, in-process: the tiny GPT's 6 strategies (fsdp at TP 2 among them) x 2 amp levels predicted on
    h100x8 in a few seconds, nothing trained, and plan.md's answer. What the preset cannot run is pruned with the
    reason a run would give: its 4 heads do not split over strategy=tp's 8 ranks, its 2 blocks make no 8 stages."""
    assert run_py(monkeypatch, tmp_path, *PRESET_SEARCH, "search.axes=[strategy,amp]") == 0, capsys.readouterr()
    data, text = plan_of(tmp_path)
    statuses = {r["name"]: r["status"] for r in data["rows"]}
    assert statuses == {**{f"{s} {a}": "predicted" for s in ("ddp", "zero", "fsdp") for a in ("O0", "O1 bf16")},
                        "fsdp O0 tp=2": "predicted", "fsdp O1 bf16 tp=2": "predicted", "tp O0": "skipped",
                        "tp O1 bf16": "skipped", "pp O0 microbatches=8": "skipped",
                        "pp O1 bf16 microbatches=8": "skipped"}
    lines = [line.strip() for line in text.splitlines()]
    assert "Search on h100x8 (predicted, nothing trained): 12 candidates, 8 predicted to fit, 4 pruned" in lines
    pruned = next(line for line in lines if line.startswith("Pruned 4 of 12: "))
    assert "2 skipped: model.heads=4 is not allowed: a multiple of the 8 tensor-parallel ranks" in pruned
    assert "2 skipped: model.layers=2 is not allowed: at least 8 with strategy=pp on 8 ranks" in pruned
    fastest = next(line for line in lines if line.startswith("Fastest predicted: "))
    assert " tokens/s (90 % band " in fastest and "ms an iteration" in fastest
    assert any(line.startswith("Runner-up: ") for line in lines)
    train = next(line for line in lines if line.startswith("Train it on h100x8: "))
    winner = data["search"]["winner"]
    assert train == f"Train it on h100x8: {winner['command']}"
    assert winner["command"].startswith("python run.py model=gpt strategy=")
    assert not (tmp_path / "runs" / "multirun").exists()


def test_tp_and_pp_refused_at_float16_with_a_dynamic_loss_scale_are_pruned_with_the_reason(tmp_path, monkeypatch,
                                                                                            capsys):
    """O1 in float16 scales the loss dynamically, which FSDP x TP, strategy=tp and strategy=pp refuse before anything
    starts: each such candidate is a pruned row with the run's own reason, and plain FSDP is the answer."""
    assert run_py(monkeypatch, tmp_path, *PRESET_SEARCH, "strategy=fsdp,tp,pp", "amp=O1", "amp.dtype=float16",
                  "model.heads=8", "search.axes=[strategy]") == 0, capsys.readouterr()
    data, _ = plan_of(tmp_path)
    rows = {r["name"]: r for r in data["rows"]}
    # strategy=tp is a candidate: fsdp at TP 2 beside it, the node's 8 being tp's
    assert sorted(rows) == ["fsdp O1 fp16", "fsdp O1 fp16 tp=2", "pp O1 fp16 microbatches=8", "tp O1 fp16"]
    assert rows["fsdp O1 fp16"]["status"] == "predicted" and data["search"]["winner"]["name"] == "fsdp O1 fp16"
    for name in ("fsdp O1 fp16 tp=2", "tp O1 fp16", "pp O1 fp16 microbatches=8"):
        assert rows[name]["status"] == "skipped" and rows[name]["reason"].startswith(
            "amp.loss_scale=dynamic is not allowed: "), rows[name]


def test_a_70b_model_on_four_nodes_over_25gbe_holds_tp_and_pp():
    """llama2_70b on a100x16-25gbe at plan.nodes=4 (32 A100s, 8 a node over NVLink, the nodes over 25 GbE): the
    space by hand, 6 groups (2 amp levels x 3 checkpointing values) of each of ddp, zero, fsdp, HSDP (replicate=4)
    and fsdp at TP 2 and 8 at their micro-batches (a rank's 4 of the 128 samples: grad_accum 1, 2, 4; a TP pair's 8:
    1 to 8; a node's 32: 1 to 32), and of pp at 32, 64 and 128 microbatches (at least its 32 stages): 150. No
    strategy=tp: its group would span the nodes."""
    found = preset_space("plan.nodes=4", hardware="a100x16-25gbe", model="llama2_70b")
    assert len(found.candidates) == 6 * (3 + 3 + 3 + 3 + 4 + 6 + 3) == 150
    assert set(values_of(found, "strategy")) == {"ddp", "zero", "fsdp", "pp"}
    assert values_of(found, "strategy.tp") == ["2", "8"] and values_of(found, "strategy.replicate") == ["4"]
    assert values_of(found, "grad_accum", "strategy.tp=8") == ["1", "2", "4", "8", "16", "32"]
    assert values_of(found, "strategy.microbatches") == ["32", "64", "128"]
    assert {"fsdp O1 bf16 tp=8 grad_accum=2 model.checkpoint=full", "pp O1 bf16 microbatches=128 model.checkpoint=none",
            "fsdp O1 bf16 replicate=4 grad_accum=4 model.checkpoint=full"} <= set(found.names)


@pytest.mark.bench  # about a minute of predictions of a 7B model's steps, beyond the suite's budget: `pytest -m bench`
def test_the_pipeline_is_the_answer_for_7b_over_25gbe(tmp_path, monkeypatch, capsys):
    """The real planner through run.py: llama2_7b on 4 nodes of 8 A100s joined by one 25 GbE port a node, at O1.
    FSDP over the 32 ranks all-gathers every layer across the slow port at every micro-step; FSDP x TP 8 gathers an
    eighth of the weights a rank, but the node's 8 data-parallel groups cross its one port together, each at an
    eighth of it (links.node_share), and at twice the micro-steps it is the slower of the two; HSDP (replicas of a
    node) reduces its gradients across the port once a step. The pipeline of 32 one-block stages sends only a
    microbatch's activations across the port, at 3 of its 31 boundaries, and holds at most 32 microbatches of 4,096
    tokens a rank (42.5 GiB): it is the answer, over HSDP by more than 10 % and plain FSDP by more than 1.8x.
    Pipelines with checkpointing are refused (the trace inlines it): pruned with that reason. (Llama 2 70B's
    pipeline, 2 blocks a stage, would hold 31 microbatches of them on rank 1: 215 GiB, docs/search.md.)"""
    code = run_py(monkeypatch, tmp_path, "-m", "search=true", "plan=true", "plan.hardware=a100x16-25gbe",
                  "plan.nodes=4", "model=llama2_7b", "strategy=fsdp,pp", "amp=O1")
    assert code == 0, capsys.readouterr()
    data, text = plan_of(tmp_path)
    answer = data["search"]
    # fsdp 3, HSDP 3, fsdp tp=2 4, fsdp tp=8 6 grad_accum values; pp 3 microbatch counts; x 3 checkpointing values
    assert answer["space"] == (3 + 3 + 4 + 6 + 3) * 3 == len(data["rows"])
    winner = "pp O1 bf16 microbatches=128 model.checkpoint=none"
    assert answer["winner"]["name"] == winner
    command = ("python run.py model=llama2_7b strategy=pp amp=O1 amp.dtype=bfloat16 strategy.microbatches=128 "
               "model.checkpoint=none")
    assert sorted(answer["winner"]["command"].split()) == sorted(command.split())
    ranked = {r["name"]: r["prediction"]["throughput_img_s"] for r in data["rows"]
              if r["status"] == "predicted" and r["prediction"]["fits"]}
    assert ranked[winner] > 1.1 * max(v for k, v in ranked.items() if k.startswith("fsdp "))
    assert ranked[winner] > 1.8 * max(v for k, v in ranked.items() if k.startswith("fsdp ") and "=" not in
                                      k.split("grad_accum")[0])  # plain FSDP over the 32 ranks
    # the node's port split among its 8 data-parallel groups: TP 8 no faster than plain FSDP
    assert ranked["fsdp O1 bf16 tp=8 grad_accum=2 model.checkpoint=full"] < \
        ranked["fsdp O1 bf16 grad_accum=1 model.checkpoint=full"]
    pruned = {p["name"]: p["why"] for p in answer["pruned"]}
    pipelines = [why for name, why in pruned.items() if name.startswith("pp ") and "checkpoint=none" not in name]
    assert len(pipelines) == 6 and all("inlines the blocks' checkpointing" in why for why in pipelines), pipelines
    assert "Train it on a100x16-25gbe (on each of its 4 nodes, under torchrun: docs/clusters.md): " in text


def test_the_documented_search_of_llama3_8b_on_h100x8_holds_fsdp_x_tp_and_pp():
    """docs/search.md's example (`model=llama3_8b`, h100x8): 204 candidates as for the GPT above (the same global
    batch, checkpointing values and node), among them the answer it shows, FSDP x TP 2 without checkpointing (a TP
    rank holds a share of each block's activations, so no recomputation fits), and the pipelines."""
    found = preset_space(model="llama3_8b")
    assert len(found.candidates) == (5 + 5 + 5 + 6 + 8 + 5) * 2 * 3 == 204
    assert {"fsdp O1 bf16 tp=2 grad_accum=32 model.checkpoint=none", "tp O1 bf16 grad_accum=64 model.checkpoint=none",
            "pp O1 bf16 microbatches=128 model.checkpoint=selective"} <= set(found.names)
