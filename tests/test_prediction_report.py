"""The report's prediction section and `--project` (harness.report.projection), on the session's shared sweep."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO, SHARED_GROUP, describe


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.report", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.xdist_group(SHARED_GROUP)
@pytest.mark.slow
def test_every_row_shows_predicted_beside_measured(shared_sweep):
    sweep, _ = shared_sweep
    md = (sweep / "report.md").read_text()
    assert "Predicted before each run, beside what it measured" in md
    rows = json.loads((sweep / "report.json").read_text())["rows"]
    ran = [r for r in rows if r["ok_runs"]]
    assert len(ran) == 3
    for row in ran:
        said = row["prediction"]  # the plan feature's section of the row (harness.prediction.report)
        assert said["predicted_peak_mib"] > 0 and said["measured_peak_mib"] > 0, row["label"]
        assert said["peak_error"] == pytest.approx((said["measured_peak_mib"] - said["predicted_peak_mib"])
                                                   / said["measured_peak_mib"], rel=1e-6)
        assert said["predicted_s_per_it"] > 0 and said["measured_s_per_it"] > 0
        # one question, one answer: the speed table's figure, not each run's own mean over its windows
        assert said["measured_s_per_it"] == pytest.approx(row["s_per_20"] / 20, rel=1e-9)
        assert said["time_error"] == pytest.approx((said["measured_s_per_it"] - said["predicted_s_per_it"])
                                                   / said["measured_s_per_it"], rel=1e-6)


@pytest.mark.xdist_group(SHARED_GROUP)
@pytest.mark.slow
def test_project_adds_the_projected_rows_and_the_scaling_plot(shared_sweep, tmp_path):
    sweep, _ = shared_sweep
    out = tmp_path / "projected"
    proc = report(str(sweep), "--out", str(out), "--project", "h100x8,h100x16-ib")
    assert proc.returncode == 0, describe(proc)
    projected = json.loads((out / "report.json").read_text())["projected"]
    by = {(p["label"].split()[0], p["hardware"]): p for p in projected}
    assert by[("ddp", "h100x8")]["devices"] == 8 and by[("ddp", "h100x16-ib")]["devices"] == 16
    assert by[("single", "h100x8")]["devices"] == 1
    # weak scaling: each rank keeps its batch (8 images over 2 ranks here: 4 each)
    assert by[("ddp", "h100x16-ib")]["global_batch"] == 16 * 4
    assert all(p["status"] == "predicted" and p["throughput_img_s"] > 0 for p in projected)
    for p in projected:  # every projection carries its band, around it, and names where the band comes from
        low, high = p["throughput_band"]
        assert low < p["throughput_img_s"] < high and "published training results" in p["band_source"]
    assert (out / "scaling.png").stat().st_size > 10_000
    md = (out / "report.md").read_text()
    assert "## Projected past this machine" in md and md.count("| h100x16-ib |") == 3
    assert ("The band: the GPU model's errors on published training results of architecture families and GPU types "
            "held out of its fit") in md
    page = (out / "index.html").read_text()
    assert 'id="projection"' in page and "90 % band" in page and "published training results" in page
    terminal = proc.stdout + proc.stderr  # --project is shown in the terminal too, not only written
    assert "Projected past this machine" in terminal and "h100x16-ib" in terminal and "The band:" in terminal


@pytest.mark.slow
def test_an_unknown_preset_to_project_onto_is_refused_before_writing(tmp_path):
    out = tmp_path / "out"
    proc = report(str(tmp_path), "--out", str(out), "--project", "h100x9")
    assert proc.returncode == 2 and "did you mean h100x8?" in proc.stderr, describe(proc)
    assert not out.exists()


@pytest.mark.xdist_group(SHARED_GROUP)
@pytest.mark.slow
def test_the_phase_before_the_first_run_says_what_it_does_and_estimates_the_sweep(shared_sweep):
    """The shared sweep predicts its 3 combinations before the first run: a line as each is predicted, then how
    long that took and the sweep's estimate (a loaded machine once printed nothing for 4 min 27 s)."""
    _, proc = shared_sweep
    out = proc.stdout
    assert "before the first run: 3 combinations predicted on this machine" in out
    for index, name in enumerate(("single O0", "ddp O0", "allreduce O0"), start=1):
        assert f"predicted {index}/3: {name} (" in out
    assert re.search(r"predictions took \d+ s\. The sweep: 3 runs a round, about \d+ s each round .*: about \d+ min\.",
                     out), out[:3000]
    assert out.index("predictions took") < out.index("[single O0] iter")
