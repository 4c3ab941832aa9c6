"""The benchmarks in bench/ run and print their tables. No assertion on any time: these are not benchmarks."""

from __future__ import annotations

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
}


@pytest.fixture(scope="session")  # module scope is torn down when xdist runs another module's test between
def quick_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               ) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """The selected scripts' --quick runs, three at a time (each is mostly process start-up)."""
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path_factory.mktemp("bench")  # made here: the factory is not for threads

    def run(script: str) -> tuple[str, tuple[subprocess.CompletedProcess[str], Path]]:
        folder = root / script.removesuffix(".py")
        folder.mkdir()
        readme = folder / "README.md"
        readme.write_text("x\n<!-- perf:start -->\n<!-- perf:end -->\n")
        proc = subprocess.run([sys.executable, str(BENCH / script), "--quick", "--runs-dir", str(folder / "runs")],
                              cwd=folder, capture_output=True, text=True, timeout=300)
        return script, (proc, readme)

    scripts = [item.callspec.params["script"] for item in request.session.items
               if getattr(item, "originalname", None) == "test_bench_script_runs_quick_and_prints_its_table"]
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(run, scripts))


@pytest.mark.slow
@pytest.mark.xdist_group("bench")  # one worker runs the shared --quick runs
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_bench_script_runs_quick_and_prints_its_table(script, quick_runs):
    proc, readme = quick_runs[script]
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for header in SCRIPTS[script]:
        assert header in proc.stdout, proc.stdout[-3000:]
    assert "OMP_NUM_THREADS" in proc.stdout and "machine:" in proc.stdout  # the pinned settings are printed
    assert readme.read_text() == "x\n<!-- perf:start -->\n<!-- perf:end -->\n"  # no README write without the flag


def test_readme_block_replaces_only_its_own_block(tmp_path):
    readme = tmp_path / "README.md"
    before, after = "# title\n\nintro\n\n## Performance\n\n", "\n\n## Later section\nkept\n"
    readme.write_text(before + f"{common.PERF_START}\n{common.PLACEHOLDER}\n{common.PERF_END}" + after)

    common.write_readme_block("scaling", "scaling v1", readme)
    common.write_readme_block("overhead", "overhead v1", readme)
    common.write_readme_block("scaling", "scaling v2", readme)
    text = readme.read_text()

    assert text.startswith(before) and text.endswith(common.PERF_END + after)
    perf = text[text.index(common.PERF_START):text.index(common.PERF_END)]
    assert common.PLACEHOLDER not in perf
    assert "scaling v1" not in perf and perf.count("scaling v2") == 1
    assert perf.index("overhead v1") < perf.index("scaling v2")  # README order, whichever ran first
    assert perf.count("python bench/report_speed.py") == 1  # the index of the six commands, once, first
    assert perf.index("<!-- bench:index:start -->") < perf.index("overhead v1")
    common.write_readme_block("overhead", "overhead v1", readme)
    assert readme.read_text() == text  # rewriting a block with the same text changes nothing


def test_readme_block_refuses_a_readme_without_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    with pytest.raises(common.BenchError):
        common.write_readme_block("overhead", "x", readme)
    assert readme.read_text() == "no markers\n"


def test_statistics_helpers():
    assert common.steady_throughput([9.0, 1.0, 1.0], images_per_window=10, warmup_windows=1) == 10.0
    assert common.fmt_spread([1.0, 3.0, 2.0], 1) == "2.0 (1.0–3.0)"
    assert common.cv_percent([1.0, 1.0]) == 0.0
