"""`python run.py -m search=true plan=true plan.hardware=<preset>` (harness/search/preset.py, harness.cli's
search_on_preset): a layout found without running. With the preset's predictions made by hand (predict_on faked):
the fastest candidate that fits is the answer and the second fastest the runner-up, what does not fit is pruned with
its reason, a micro-batch larger than one that does not fit is pruned without its prediction, nothing is launched,
and the command that trains the winner reproduces it without the search's keys. Then one real search of a tiny GPT
on h100x8, in-process through run.py."""

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


def made_by_hand(cfg: RunConfig) -> tuple[float, float]:
    """(seconds an iteration, peak MiB) of a candidate. A rank's batch is 128 / 8 = 16 samples: micro-batches of
    16 / grad_accum. fsdp fits at every micro-batch, ddp up to 8 samples, zero only at 1 (its 2 does not fit: its
    4, 8 and 16 are pruned unpredicted); memory grows with the model's width (64 by default). Faster: fsdp, then
    ddp, then zero; O1 by 0.8; each halving of the micro-batch costs 10 %."""
    micro = cfg.batch_size // 8 // cfg.grad_accum
    base = {"fsdp": 0.9, "ddp": 1.0, "zero": 1.1}[cfg.strategy_name]
    seconds = base * (0.8 if cfg.amp.level == "O1" else 1.0) * (1 + 0.1 * math.log2(cfg.grad_accum))
    peak = {"fsdp": 50.0, "ddp": 110.0, "zero": 600.0}[cfg.strategy_name] * micro * cfg.model["width"] / 64
    return seconds, peak


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
    code = search("model.width=64", "model.seq_len=64", "search.axes=[strategy,amp,micro_batch]")
    out = capsys.readouterr().out
    assert code == 0, out
    data, text = plan_of(tmp_path)
    rows = data["rows"]
    # 3 strategies x 2 amp levels x 5 micro-batches; zero's 3 larger than 2 samples, at O0 and O1, not predicted
    assert len(rows) == 30 and len(faked) == 24
    assert not [c for c in faked if c.strategy_name == "zero" and c.grad_accum in (1, 2, 4)]
    answer = data["search"]
    assert answer["winner"]["name"] == "fsdp O1 bf16 grad_accum=1"
    assert answer["runner_up"]["name"] == "fsdp O1 bf16 grad_accum=2"
    assert answer["winner"]["s_per_iteration"] == pytest.approx(0.72)
    assert answer["pruned_by_reason"] == {"predicted not to fit": 4, preset.LARGER_MICRO: 6}
    misfits = {p["name"]: p["reason"] for p in answer["pruned"] if p["why"] == "predicted not to fit"}
    assert set(misfits) == {"ddp O0 grad_accum=1", "ddp O1 bf16 grad_accum=1", "zero O0 grad_accum=8",
                            "zero O1 bf16 grad_accum=8"}
    assert misfits["zero O0 grad_accum=8"].startswith("predicted peak 1.2 GiB > 1.0 GiB on cuda:0")
    larger = {p["name"]: p["reason"] for p in answer["pruned"] if p["why"] == preset.LARGER_MICRO}
    assert larger["zero O1 bf16 grad_accum=1"] == "zero O1 bf16 grad_accum=8"
    # the winner's command: its overrides as typed and searched, no search/plan/sweep key, bfloat16 autocast
    command = answer["winner"]["command"]
    assert command == ("python run.py model=gpt model.width=64 model.seq_len=64 strategy=fsdp amp=O1 amp.dtype=bfloat16 "
                       "grad_accum=1")
    assert not [w for w in command.split()[2:] if key_of(w).partition(".")[0] in ("search", "plan", "sweep", "hydra")]
    winner = next(r for r in rows if r["name"] == answer["winner"]["name"])
    assert command.split()[2:] == [o for o in winner["overrides"] if key_of(o).partition(".")[0] not in
                                   ("search", "plan", "sweep", "hydra")]
    # tokens/s: 64 tokens a sample, 128 samples in 0.72 s
    assert answer["winner"]["unit"] == "tokens/s" and answer["winner"]["rate"] == pytest.approx(128 / 0.72 * 64)
    assert answer["winner"]["rate_band"] == pytest.approx([128 / 0.9 * 64, 128 / 0.576 * 64])
    for said in (out, text):
        assert "Fastest predicted: fsdp O1 bf16 grad_accum=1: 11,378 tokens/s (90 % band 9,102–14,222)" in said
        assert "Runner-up: fsdp O1 bf16 grad_accum=2: 10,343 tokens/s" in said and "; the winner is 1.10x as fast" in said
        assert ("Pruned 10 of 30: 4 predicted not to fit, 6 larger micro-batch than one that does not fit" in said)
        assert f"Train it on h100x8: {command}" in said
    assert "search: 1/30 ddp O0 grad_accum=16: predicted (" in out
    assert "zero O0 grad_accum=4: pruned: larger micro-batch than one that does not fit (zero O0 grad_accum=8)" in out
    assert not (tmp_path / "runs" / "multirun").exists()


def test_the_same_config_is_predicted_once(faked, tmp_path, capsys):
    """Two candidates that compose the same config (a value typed twice, spelled two ways): one prediction."""
    assert search("search.axes=[amp]", "strategy=fsdp", "grad_accum=2", "model.layers=2,int(2.0)") == 0
    data, _ = plan_of(tmp_path)
    assert len(data["rows"]) == 2 * 2 and len(faked) == 2
    same = [r for r in data["rows"] if r["status"] == "pruned"]
    assert len(same) == 2 and all(r["reason"].startswith(preset.SAME) for r in same)


def test_the_axes_on_a_gpu_preset(faked, tmp_path, capsys):
    """Unless search.axes is typed: ddp, zero, fsdp, O0 and O1 as bfloat16,
    every power-of-two micro-batch of a rank's 16 samples, and the model's own checkpointing values; no compile,
    no comm_hook, no bucket."""
    from harness.compose import compose_one, hydra_context
    from harness.core.options import option_choices

    overrides = [cli.plan_shorthand(o) for o in PRESET_SEARCH[1:]]
    with hydra_context():
        found = preset.preset_space(overrides, compose_one(overrides).run)
    strategies = ["ddp", "zero", "fsdp"]
    checkpoint = option_choices("harness.rank.gpt.GPT", "checkpoint")
    assert checkpoint is not None
    assert len(found.candidates) == len(strategies) * 2 * 5 * len(checkpoint)
    keys = {key_of(o) for c in found.candidates for o in c}
    assert not keys & {"compile", "strategy.comm_hook", "strategy.bucket_cap_mb"}
    values = {k: sorted({o.partition("=")[2] for c in found.candidates for o in c if key_of(o) == k})
              for k in ("strategy", "amp", "grad_accum", "model.checkpoint", "amp.dtype")}
    assert values == {"strategy": sorted(strategies), "amp": ["O0", "O1"], "grad_accum": ["1", "16", "2", "4", "8"],
                      "model.checkpoint": sorted(checkpoint), "amp.dtype": ["bfloat16"]}
    assert all(("amp=O1" in c) == ("amp.dtype=bfloat16" in c) for c in found.candidates)


def test_on_more_than_one_node_fsdp_is_also_searched_sharded_within_each_node():
    """plan.nodes=2: every fsdp candidate also as HSDP with one replica a node (strategy.replicate=2), named so and
    trained by its command; plain fsdp is spelled without the option, ddp and zero are as they were. A typed
    strategy.replicate is the user's: no second candidate."""
    from harness.compose import compose_one, hydra_context

    def candidates(*extra: str, nodes: int = 2) -> preset.Space:
        overrides = [cli.plan_shorthand(o) for o in (*PRESET_SEARCH[1:], f"plan.nodes={nodes}",
                                                      "search.axes=[strategy,amp]", *extra)]
        with hydra_context():
            return preset.preset_space(overrides, compose_one(overrides).run)

    found = candidates()
    by_name = dict(zip(found.names, found.candidates, strict=True))
    assert sorted(by_name) == sorted(["ddp O0", "ddp O1 bf16", "zero O0", "zero O1 bf16", "fsdp O0", "fsdp O1 bf16",
                                      "fsdp O0 replicate=2", "fsdp O1 bf16 replicate=2"])
    assert "strategy.replicate=2" in by_name["fsdp O1 bf16 replicate=2"]
    assert not [c for c in found.candidates if "strategy.replicate=1" in c]
    assert not [c for c in found.candidates if "strategy=fsdp" not in c and "strategy.replicate=2" in c]
    assert any("HSDP (strategy.replicate=2)" in said for said in found.axes)
    assert preset.command(by_name["fsdp O0 replicate=2"]) == "python run.py model=gpt strategy=fsdp " \
        "strategy.replicate=2 amp=O0"
    assert preset.command(by_name["fsdp O0"]) == "python run.py model=gpt strategy=fsdp amp=O0"
    typed = candidates("strategy=fsdp", "strategy.replicate=2")
    assert len(typed.candidates) == 2 and all("strategy.replicate=2" in c for c in typed.candidates)
    assert len(candidates(nodes=1).candidates) == 6  # one node: nothing to replicate across


def test_a_space_where_nothing_fits_is_one_line_and_exit_2(faked, tmp_path, capsys):
    code = search("strategy=zero", "amp=O0", "search.axes=[micro_batch]", "batch_size=256", "model.width=128")
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == cli.EXIT_BAD_INPUT and len(lines) == 1, lines
    assert lines[0].startswith("error: search=true is not allowed: a space with a combination predicted to fit on "
                               "h100x8: none of the 6 does (1 predicted not to fit, 5 larger micro-batch than one that "
                               "does not fit; e.g. predicted peak"), lines
    assert len(faked) == 1  # grad_accum=32 (1 sample) does not fit: nothing larger is predicted


def test_without_multirun_it_is_one_line(faked, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.precheck(list(PRESET_SEARCH[1:]))
    lines = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == cli.EXIT_BAD_INPUT and lines == [
        "error: search=true is not allowed: with -m: a search predicts many combinations (python run.py -m search=true "
        "plan=true plan.hardware=h100x8 ...)"]
    assert not faked


def test_a_tiny_gpt_searched_on_h100x8_end_to_end(tmp_path, monkeypatch, capsys):
    """run.py itself, in-process: the tiny GPT's 3 strategies x 2 amp levels predicted on h100x8 in a few seconds,
    nothing trained, and plan.md's answer."""
    def launched(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a search on a preset launches nothing")

    for entry in ("harness.cli.check_runs", "harness.launch.launcher.launch_workers", "harness.launch.runner.execute"):
        monkeypatch.setattr(entry, launched)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["run.py", *PRESET_SEARCH, "search.axes=[strategy,amp]"])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(REPO / "run.py"), run_name="__main__")
    assert stopped.value.code == 0, capsys.readouterr()
    data, text = plan_of(tmp_path)
    assert [r["status"] for r in data["rows"]] == ["predicted"] * 6
    lines = [line.strip() for line in text.splitlines()]
    assert "Search on h100x8 (predicted, nothing trained): 6 candidates, 6 predicted to fit, 0 pruned" in lines
    fastest = next(line for line in lines if line.startswith("Fastest predicted: "))
    assert " tokens/s (90 % band " in fastest and "ms an iteration" in fastest
    assert any(line.startswith("Runner-up: ") for line in lines)
    train = next(line for line in lines if line.startswith("Train it on h100x8: "))
    winner = data["search"]["winner"]
    assert train == f"Train it on h100x8: {winner['command']}"
    assert winner["command"].startswith("python run.py model=gpt strategy=")
    assert not (tmp_path / "runs" / "multirun").exists()
