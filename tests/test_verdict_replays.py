"""The sentences users read in real sweeps at 63d49a2 (issue 49), replayed from their results: each folder in
tests/data/verdict_replays (written by its make.py, throughputs set by hand) is reported as `python -m
harness.report FOLDER` reports it, and the verdict must read right."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from harness.report.findings import compute
from harness.report.tables import to_markdown
from harness.verdict.rule import rounds_to_show_within, rounds_to_tell

DATA = Path(__file__).parent / "data" / "verdict_replays"


def replay(name: str) -> tuple[str, str]:
    """The report's verdict and its report.md, as `python -m harness.report FOLDER` computes them (no plots)."""
    computed = compute([DATA / name])
    return computed.decision.verdict, to_markdown(computed)


def test_the_undecided_sentence_names_the_pair_still_open_and_plans_for_the_margin():
    """single O1 is slower than single O0 (0.80x, every round within 2 %); single O3 is the pair still open. Its
    per-round log ratios 0.0325, -0.1054, 0.0718, -0.0369 (SD 0.0782: 8.1 %) among 8 judged rows (28 pairs,
    0.05 / 28 = 0.0018 a pair): by the normal, (3.12 + 0.84)^2 x (0.0782 / 0.0488)^2 = 40 rounds to tell 5 % apart;
    the t's few degrees of freedom add some. At 40 s a round, the larger of the two at its pace."""
    said, _ = replay("open_pair")
    assert "leads single O1" not in said and "no estimate" not in said
    assert "Undecided: single O0 (968.0 img/s" in said and "still open against it: single O3 0.99× [" in said
    tell, within = rounds_to_tell(0.07815, 0.05, 0.05 / 28), rounds_to_show_within(0.07815, 0.05, 0.05 / 28)
    assert 40 <= tell <= 50 and 40 <= within <= 55
    assert (f"to tell 5 % apart: {tell} rounds; to show them within ±5 %: {within} rounds (at the noisiest open "
            "pair's per-round SD 8.1 %)") in said
    rounds = max(tell, within)
    assert (f"about {math.ceil(rounds * 40 / 60)} min at this sweep's pace: python run.py -m "
            f"strategy=single,ddp,dp amp=O0,O1,O2,O3 repeat={rounds}.") in said
    assert "Slower: single O1 0.80× [" in said and "Did not run here: 4 skipped" in said


def test_rows_whose_samples_hold_different_tokens_are_ranked_in_tokens_per_second():
    """seq_len=64 at about 686 samples/s is 43,900 tokens/s; seq_len=128 at about 474 samples/s is 60,600: the
    longer sequences train more tokens a second, and lead (1.38x), as the table's tokens/s say."""
    said, _ = replay("tokens")
    assert said.startswith("Fastest: fsdp O0 model.seq_len=128, 606")
    assert "tokens/s" in said.split(";")[0] and "the runner-up fsdp O0 model.seq_len=64" in said
    found = re.search(r"; ([\d.]+)× \[([\d.]+)–([\d.]+)\] the runner-up", said)
    assert found and float(found.group(2)) > 1 and float(found.group(1)) == pytest.approx(60605 / 43912, abs=0.01)
    # by hand, paired by round in tokens: 128 x (470, 480, 468, 476) over 64 x (690, 680, 700, 675) has log ratios
    # of mean 0.3221 and SD 0.0268; one look at repeat=4 at the pair's whole 0.05: t(0.975, 3) = 3.182, so
    # exp(0.3221 -+ 3.182 x 0.0268 / 2) = 1.32-1.44 (in samples/s it would be 0.69x, and the other row would lead)
    assert "; 1.38× [1.32–1.44] the runner-up fsdp O0 model.seq_len=64 (faster: its interval excludes 1)" in said
    assert "Ranked in tokens/s: the rows' samples hold different numbers of tokens." in said


def test_the_tables_tokens_per_second_are_samples_per_second_times_the_sequences_tokens():
    """686.2 samples/s of 64 tokens: 43,916 tokens/s; 473.5 of 128: 60,605; the intervals scale alike."""
    _, page = replay("tokens")
    table = page.split("| combination | devices | runs | s/20 it [95 %] | samples/s [95 %] | tok/s [95 %] |")[1]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines()[2:4]}
    for label, tokens in (("fsdp O0 model.seq_len=64", 64), ("fsdp O0 model.seq_len=128", 128)):
        samples = re.match(r"([\d.]+) \[([\d.]+)–([\d.]+)\]", rows[label][4])
        said = re.match(r"(\d+) \[(\d+)–(\d+)\]", rows[label][5])
        assert samples and said, rows[label]
        for sample_figure, token_figure in zip(samples.groups(), said.groups(), strict=True):
            assert int(token_figure) == pytest.approx(float(sample_figure) * tokens, abs=0.05 * tokens + 1)
    assert rows["fsdp O0 model.seq_len=64"][5].startswith("43916 ")


def test_a_busy_machine_never_gives_a_fastest_that_another_row_beats():
    """ddp O2 and single O1 were each quiet in one round only, and not the same one; round 2 ran 12 % faster
    (single O0: 500 then 560). single O1's 720 in round 2 is 643 at round 1's pace, below ddp O2's 686.7: ddp O2
    leads by the levels, 1.06x (the raw 686.7 / 720 = 0.95 it printed compares two machines). No interval from
    one degree of freedom, and no 'Fastest'."""
    said, _ = replay("busy")
    assert "Fastest" not in said and "0.95×" not in said
    assert said.startswith("Highest measured: ddp O2, ") and "1.06× single O1 by the round-adjusted levels" in said
    assert "img/s [" not in said.split(";")[0]
    assert "share no round in which both ran on a quiet machine" in said
    assert "Not judged (every run measured while the machine was busy): single O2, ddp O1." in said


def test_a_row_whose_last_run_was_busy_is_not_stopped():
    """repeat=3: ddp's round-3 run was busy, so its last quiet round is 2; nothing stopped it."""
    said, page = replay("repeat_busy_last")
    assert "stopped" not in page.lower() and "stopped" not in said.lower()
    assert said.startswith("Fastest: single O0")


def test_each_run_of_a_replayed_sweep_records_its_place_and_the_run_before_it():
    """What the rounds sweeper writes: 4 rows in 4 rounds of a Williams design, each row once in each place."""
    places: dict[str, list[int]] = {}
    for path in (DATA / "tokens").rglob("results.json"):
        data = json.loads(path.read_text())
        places.setdefault(data["overrides"][1], []).append(data["place"])
    assert {k: sorted(v) for k, v in places.items()} == {"model.seq_len=64": [1, 1, 2, 2],
                                                         "model.seq_len=128": [1, 1, 2, 2]}
    plan = json.loads((DATA / "open_pair" / "rounds.json").read_text())
    assert all(sorted(order) == list(range(12)) for order in plan["orders"])
