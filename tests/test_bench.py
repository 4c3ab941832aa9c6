"""The benchmarks in bench/ run and print their tables. No assertion on any time: these are not benchmarks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402  (bench/common.py: bench/ is a folder of scripts, not a package)

# script -> table headers its --quick run must print
SCRIPTS = {
    "overhead.py": ["== harness overhead"],
    "sampler.py": ["== the sampler's own work", "== throughput with the sampler on / off"],
    "ddp_vs_torchrun.py": ["== DDP 2 workers: harness vs torchrun"],
    "timing_fidelity.py": ["== extra N iterations: the harness's own clock vs this script's", "== summary =="],
    "report_speed.py": ["== report over 20 synthetic results.json files =="],
    "scaling.py": ["== tiny_cnn, global batch 8"],
    "failure_detection.py": ["== a worker's death to the other worker's SIGTERM"],
    "hook_cost.py": ["== the trainer's calls, per call"],
    "main_job.py": ["== the main job from a fresh clone"],
    "modern.py": ["== tiny_cnn, global batch 8, 2 workers"],
    "profile_cost.py": ["== tiny_cnn, DDP 2 workers: profile=true against profile=false"],
    "verdicts.py": ["== verdicts against known truths"],
    "prediction.py": ["== predicted against measured, per case"],
    "prediction_llm.py": ["== predicted against measured, per case"],
    "search.py": ["== searches against the exhaustive sweep =="],
    "projection.py": ["== each published result, predicted by factors fitted without it",
                      "== the same prediction, quiet and loaded"],
    "mutants.py": ["== mutants: the tests that cover each, run against it =="],
    "published_llm.py": ["== each published run, planned", "== errors by group"],
    "link_after_compute.py": ["== one call on two gloo workers, ms"],
}


SCRIPTS_STEMS = [s.removesuffix(".py") for s in SCRIPTS]
# Every script's --quick run is under `-m bench` (tests/README.md), as anyone changing a bench script or what it
# reads should run: those that start real runs take 15-30 s each, and the four that start none (hook_cost,
# report_speed, sampler, verdicts: 40 s of CPU together) were the default suite's, which stays under ten minutes
# on two cores. mutants.py's texts are checked by tests/test_mutants.py in the default suite.


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_bench_script_runs_quick_and_prints_its_table(script, tmp_path):
    """Each script's --quick run, a test of its own (xdist spreads them over its workers: each is mostly process
    start-up, and one worker running all thirteen was the suite's longest stretch, 4 minutes)."""
    folder = tmp_path / script.removesuffix(".py")
    folder.mkdir()
    before = snapshot(common.RESULTS_DIR)
    proc = subprocess.run([sys.executable, str(BENCH / script), "--quick", "--runs-dir", str(folder / "runs")],
                          cwd=folder, capture_output=True, text=True, timeout=300)
    assert snapshot(common.RESULTS_DIR) == before, f"{script} --quick wrote into benchmarks/"
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for header in SCRIPTS[script]:
        assert header in proc.stdout, proc.stdout[-3000:]
    assert "OMP_NUM_THREADS" in proc.stdout and "machine:" in proc.stdout  # the pinned settings are printed
    # nothing but the runs it asked for (scripts that start no run.py leave none): no page without --write-results
    assert {p.name for p in folder.iterdir()} <= {"runs"}


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder`: its bytes and its modification time (ns), to see what a writer touched."""
    if not folder.is_dir():
        return {}
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_write_results_replaces_only_its_own_page(tmp_path):
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "notes.md").write_text("kept\n")

    common.write_results("scaling", "# scaling v1\n", folder)
    common.write_results("overhead", "# overhead v1\n", folder)
    overhead = snapshot(folder)["overhead.md"]
    common.write_results("scaling", "# scaling v2\n", folder)

    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "notes.md", "overhead.md", "scaling.md"]
    assert (folder / "notes.md").read_text() == "kept\n"
    assert (folder / "scaling.md").read_text() == "# scaling v2\n"  # replaced whole, nothing of v1 left
    assert snapshot(folder)["overhead.md"] == overhead  # another bench's page: not even rewritten
    index = (folder / "README.md").read_text()
    assert index == common.index_page()
    for b in common.BENCHES:  # every bench once, in BENCHES' order, linking its page
        assert index.count(f"`python bench/{b.name}.py`") == 1 and f"]({b.name}.md)" in index
    positions = [index.index(f"]({b.name}.md)") for b in common.BENCHES]
    assert positions == sorted(positions)

    before = snapshot(folder)
    common.write_results("overhead", "# overhead v1\n", folder)
    assert snapshot(folder) == before  # rewriting a page with the same text changes nothing, not even mtimes


def test_write_results_refuses_an_unknown_bench_and_writes_nothing(tmp_path):
    folder = tmp_path / "benchmarks"
    with pytest.raises(common.BenchError, match="no benchmark named 'nope'"):
        common.write_results("nope", "x", folder)
    assert not folder.exists()


def test_every_bench_script_has_its_entry_and_its_page():
    """BENCHES, the scripts in bench/ and the pages in benchmarks/ name the same benchmarks; each page is the
    one its script writes (its heading is the index's number and title)."""
    names = [b.name for b in common.BENCHES]
    assert sorted(names) == sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "common") == \
        sorted(SCRIPTS_STEMS)
    assert sorted(p.stem for p in common.RESULTS_DIR.glob("*.md")) == sorted([*names, "README"])
    assert (common.RESULTS_DIR / "README.md").read_text() == common.index_page()
    for n, b in enumerate(common.BENCHES, 1):
        page = (common.RESULTS_DIR / f"{b.name}.md").read_text()
        assert re.match(rf"# {n}\. {re.escape(b.title)}\n\n`python bench/{b.name}\.py( --[a-z-]+ \S+)* "
                        "--write-results` — measured ", page), page[:300]  # with the options it ran with
        assert f'common.write_results("{b.name}", ' in (BENCH / f"{b.name}.py").read_text()


def test_results_page_is_what_the_page_files_look_like():
    table = common.Table("t", ["a", "b"])
    table.add("x", "1|2")
    page = common.results_page("modern", {"cores": 2}, [table], ["- a line"])
    assert page.startswith("# 11. Sharding and communication hooks on CPU\n\n`python bench/modern.py --write-results`")
    assert "Pinned: cores 2.\n\n*t*\n\n| a | b |\n|:---|---:|\n| x | 1/2 |\n\n- a line\n" in page


def test_quick_write_results_without_a_folder_is_refused(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    with pytest.raises(SystemExit) as info:
        common.parse_args(parser, ["--quick", "--write-results"])
    assert info.value.code == 2
    args = common.parse_args(argparse.ArgumentParser(), ["--quick", "--write-results", "--results-dir", str(tmp_path)])
    assert args.results_dir == tmp_path
    assert common.parse_args(argparse.ArgumentParser(), []).results_dir == common.RESULTS_DIR


def test_statistics_helpers():
    assert common.steady_throughput([9.0, 1.0, 1.0], images_per_window=10, warmup_windows=1) == 10.0
    assert common.fmt_spread([1.0, 3.0, 2.0], 1) == "2.0 (1.0–3.0)"
    assert common.cv_percent([1.0, 1.0]) == 0.0


def test_search_bench_counts_an_answer_right_by_the_exhaustive_truth_or_by_construction():
    """bench/search.py's rule, hand-worked: leader 100 samples/s, margin 5 %: 96 is within it, 94 is not; in the tie
    space the leader's own run under the other label (a key the run never reads) is right however far apart 8
    noisy rounds measured it, and no other run is; one the sweep did not separate from its leader is in its top set,
    which is shown but never counted right."""
    search_bench = __import__("search")  # bench/search.py (bench/ is on sys.path above)
    tie = next(s for s in search_bench.SPACES if s.name == "tie")
    assert tie.run_of("grad_accum=1 dist.timeout_s=61") == tie.run_of("grad_accum=1 dist.timeout_s=60") == "grad_accum=1"
    truth = search_bench.Truth(
        wall_s=1.0, throughput={"grad_accum=1 dist.timeout_s=60": 100.0, "grad_accum=1 dist.timeout_s=61": 90.0,
                                "grad_accum=4 dist.timeout_s=60": 96.0, "grad_accum=4 dist.timeout_s=61": 94.0},
        s_per_iteration={}, leader="grad_accum=1 dist.timeout_s=60", tied=[], open=["grad_accum=4 dist.timeout_s=61"],
        decided=None, margin=0.05, space=tie)
    assert truth.why_right("grad_accum=1 dist.timeout_s=60") == "the leader"
    assert truth.why_right("grad_accum=4 dist.timeout_s=60") == "within the margin"
    assert truth.why_right("grad_accum=1 dist.timeout_s=61") == "the leader's run"
    assert truth.why_right("grad_accum=4 dist.timeout_s=61") is None
    assert truth.why_right(None) is None
    # not separated from the leader by the exhaustive sweep: shown as "in its top", still not right (94 < 95)
    assert truth.in_top("grad_accum=4 dist.timeout_s=61") and not truth.right("grad_accum=4 dist.timeout_s=61")
    assert not truth.in_top("grad_accum=4 dist.timeout_s=60") and not truth.in_top(None)
    clear = next(s for s in search_bench.SPACES if s.name == "clear")
    assert clear.run_of("grad_accum=2") == "grad_accum=2"  # no label there: every combination is its own run


def test_search_bench_runs_the_exhaustive_sweep_between_the_searches():
    """Of 5 searches 2 run before the exhaustive sweep and 3 after, so a drift of the machine weighs on both sides
    of the cost ratio; each sweep has its own folder."""
    search_bench = __import__("search")
    order = search_bench.ordered("batch", 5, ["search=true"], ["repeat=8"])
    assert [name for name, _ in order] == ["batch-search0", "batch-search1", "batch-exhaustive", "batch-search2",
                                           "batch-search3", "batch-search4"]
    assert dict(order)["batch-exhaustive"] == ["repeat=8"] and dict(order)["batch-search4"] == ["search=true"]
    assert [name for name, _ in search_bench.ordered("clear", 1, [], [])] == ["clear-exhaustive", "clear-search0"]


def test_a_case_of_fresh_processes_is_judged_by_its_medians():
    """Benchmarks 13 and 15 with --fresh 3: a case's three runs (100, 110 and 160 ms/it measured, one predicted
    100 ms/it) are one row at the median, 110 (not the mean, 123.3), its range 100-160; a run that failed counts
    in neither, and a case none of whose runs measured is no figure."""
    import prediction

    def run(ms: float | None, amp: str = "O0", status: str = "ok") -> dict:
        measured = None if ms is None else {"measured_s_per_iteration": ms / 1000, "measured_peak_mib": 20.0}
        return {"model": "gpt", "strategy": "tp", "world_size": 2, "amp": amp, "variant": "", "status": status,
                "config": {"model": {"checkpoint": False}}, "prediction_error": measured,
                "prediction": {"s_per_iteration": 0.100, "peak_mib": 19.0}}

    cases = prediction.by_case([run(160), run(100, "O1", "failed"), run(100), run(110), run(None, "O1")])
    assert [len(runs) for runs in cases.values()] == [3, 2]
    figures = [prediction.case_figures(runs) for runs in cases.values()]
    assert figures[0] == {"peak_pred": 19.0, "peak_meas": 20.0, "s_pred": 0.1, "s_meas": 0.11, "s_low": 0.1,
                          "s_high": 0.16, "runs": 3}
    assert figures[1] is None


def test_each_case_of_benchmarks_13_and_15_is_a_sweep_of_its_own_with_the_cpus_drift(tmp_path):
    """A sweep's comma lists become its cases in the sweep's order, as run.py -m runs them (a list in brackets
    stays one value; Hydra writes booleans True/False), and a case's runs carry its folder's CPU drift, after /
    before (0.18 / 0.20 = 0.90x, not 1.11x); runs of a folder without the record carry none; a refused case is a
    row with its reason, not a run."""
    import prediction

    assert prediction.each_case(["strategy=ddp,zero", "amp=O0", "nprocs=1,2", "gpus=[0,1]", "repeat=3"]) == [
        ["strategy=ddp", "amp=O0", "nprocs=1", "gpus=[0,1]", "repeat=3"],
        ["strategy=ddp", "amp=O0", "nprocs=2", "gpus=[0,1]", "repeat=3"],
        ["strategy=zero", "amp=O0", "nprocs=1", "gpus=[0,1]", "repeat=3"],
        ["strategy=zero", "amp=O0", "nprocs=2", "gpus=[0,1]", "repeat=3"]]
    assert prediction.each_case(["strategy=single", "amp=O0", "model.checkpoint=false,true"]) == [
        ["strategy=single", "amp=O0", "model.checkpoint=False"], ["strategy=single", "amp=O0", "model.checkpoint=True"]]
    for folder, rates in (("gpt-00", {"before_tflops": 0.20, "after_tflops": 0.18}), ("gpt-01", None)):
        for job in ("0", "1"):
            (tmp_path / folder / job).mkdir(parents=True)
            (tmp_path / folder / job / "results.json").write_text(json.dumps({"case": folder}))
        if rates:
            (tmp_path / folder / prediction.SPEED_FILE).write_text(json.dumps(rates))
    drifts = sorted((r["case"], r.get("cpu_drift")) for r in prediction.cases(tmp_path))
    assert drifts == [("gpt-00", pytest.approx(0.9)), ("gpt-00", pytest.approx(0.9)), ("gpt-01", None),
                      ("gpt-01", None)]
    # a case the harness refused (exit 2) is kept as refused, labelled as the table labels a run, with its reason
    (tmp_path / "gpt-02").mkdir()
    (tmp_path / "gpt-02" / prediction.REFUSED_FILE).write_text(json.dumps({
        "overrides": ["strategy=pp", "amp=O1", "model=gpt", "model.checkpoint=True"], "reason": "not with pp"}))
    (tmp_path / "gpt-03").mkdir()  # as a sweep writes it: False, not false
    (tmp_path / "gpt-03" / prediction.REFUSED_FILE).write_text(json.dumps({
        "overrides": ["strategy=pp", "amp=O1", "model=gpt", "model.checkpoint=False"], "reason": "not with pp"}))
    assert prediction.refused_cases(tmp_path) == [("gpt pp O1 checkpoint", "not with pp"), ("gpt pp O1", "not with pp")]
    assert len(prediction.cases(tmp_path)) == 4
