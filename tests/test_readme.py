"""Every command line the README and docs/*.md show is checked as typed: composed, its values checked, and
placed on this machine (a command naming GPUs this machine lacks must be refused, saying so). The README stays
short (at most 300 lines) and every relative link in it and in docs/ points at a file that exists."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO

from harness import cli
from harness.compose import compose_one, has_gpu, hydra_context
from harness.launch.placement import probe_hardware

COMMAND = re.compile(r"^    (?:python|\.venv/bin/python) (run\.py|-m harness\.collectives|-m harness\.report)(.*)$")


LINK = re.compile(r"\]\(([^)\s]+)\)")
README_LINES = 300


def documents() -> list[Path]:
    """The README and every page beside it in docs/: the files whose command lines and links are checked."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def readme_commands(tool: str, files: list[Path] | None = None) -> list[list[str]]:
    found = []
    for path in documents() if files is None else files:
        for line in path.read_text().splitlines():
            match = COMMAND.match(line)
            if match and match.group(1) == tool and (args := shlex.split(match.group(2), comments=True)) not in found:
                found.append(args)  # a command documented in two places is checked once
    return found


def names_missing_gpus(args: list[str]) -> bool:
    """GPU ids on a machine without GPUs, typed or from experiment=seed_blog (GPUs 0, 1 and 3): every
    combination is refused, so a single run and a sweep alike stop before anything starts."""
    return not has_gpu() and any(re.fullmatch(r"gpus=\[\d[\d,]*\]", a) or a == "experiment=seed_blog" for a in args)


RUN_COMMANDS = readme_commands("run.py")
COLLECTIVES = readme_commands("-m harness.collectives")


def test_the_readme_has_the_commands_this_test_checks():
    assert len(RUN_COMMANDS) >= 10 and len(COLLECTIVES) >= 3 and readme_commands("-m harness.report")
    assert len(readme_commands("run.py", [REPO / "README.md"])) >= 8  # the everyday commands stay in the README
    assert len(documents()) > 10 and len(readme_commands("run.py", documents()[1:])) >= 8  # and docs/ has its own


def test_the_readme_is_at_most_300_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines; the reference belongs in docs/"


def linked_pages() -> list[Path]:
    """The pages whose links are checked: the README, docs/ and the benchmarks' pages in benchmarks/."""
    return [*documents(), *sorted((REPO / "benchmarks").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    found: set[str] = set()
    for line in page.read_text().splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            found.add(slug)
    return found


def broken_links(page: Path) -> list[str]:
    """The page's relative links whose file, or whose heading (`#anchor` in a Markdown page), does not exist."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("page", linked_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_to_a_file(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(REPO)}: links to missing files or headings: {broken}"


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("## Horovod, XLA and MPI\n")
    page.write_text("# A title, with `code`\n\n[a](#a-title-with-code) [b](other.md#horovod-xla-and-mpi) "
                    "[c](missing.md) [d](#nope) [e](other.md#a-title-with-code) [f](https://example.org/x)\n")
    assert anchors(page) == {"a-title-with-code"}
    assert broken_links(page) == ["missing.md", "#nope (no such heading)", "other.md#a-title-with-code (no such heading)"]
    assert len(linked_pages()) >= len(documents()) + 12  # the benchmarks' index and their eleven pages too


@pytest.fixture
def checks_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Acceptance, not prediction: the predictions precheck makes for every run (tests/test_plan_*.py check
    them) are skipped, and `plan=true` composes and checks its presets without predicting (a search on a preset:
    its space composed; tests/test_search_preset.py predicts)."""
    from harness import planning
    from harness.launch import runner
    from harness.search import preset

    def plan_checked(configs):  # noqa: ANN001, ANN202
        planning.check_plan_presets([cfg for _, cfg in configs])
        return 0

    def search_checked(overrides, base):  # noqa: ANN001, ANN202
        planning.check_plan_presets([base])
        assert preset.preset_space(overrides, base).candidates
        return 0

    monkeypatch.setattr(runner, "predict_run", lambda *args, **kwargs: None)
    monkeypatch.setattr(planning, "plan_command", plan_checked)
    monkeypatch.setattr(cli, "search_on_preset", search_checked)


TOKEN_FILES = re.compile(r"^    python -m examples\.tokens (.*)$")


@pytest.fixture(scope="module")
def documented_files() -> None:
    """The files the docs write before the commands that read them (`python -m examples.tokens ... --out
    runs/tokens.bin`, then `data.file=runs/tokens.bin`), written as the docs say, from the repository's root."""
    import glob

    from examples.tokens import main

    for path in documents():
        for line in path.read_text().splitlines():
            if match := TOKEN_FILES.match(line):
                args = [hit for arg in shlex.split(match.group(1))
                        for hit in (sorted(glob.glob(arg, root_dir=REPO)) if "*" in arg else [arg])]
                main([str(REPO / a) if not a.startswith("-") else a for a in args])


@pytest.mark.parametrize("args", RUN_COMMANDS, ids=[" ".join(a) for a in RUN_COMMANDS])
def test_every_run_py_command_is_accepted_as_typed(args, capsys, checks_only, documented_files):
    if any(a in ("plan=true", "plan.enabled=true") for a in args):
        with pytest.raises(SystemExit) as info:
            cli.precheck(args)
        assert info.value.code == 0 and capsys.readouterr().err == ""
        return
    if names_missing_gpus(args):
        with pytest.raises(SystemExit) as info:
            cli.precheck(args)
        assert info.value.code == cli.EXIT_BAD_INPUT
        assert "no visible GPU" in capsys.readouterr().err
        return
    argv = cli.precheck(args)
    assert capsys.readouterr().err == ""
    assert [a for a in argv if a != "sweep=none"] == [a for a in args if a.startswith("-")] + \
        [cli.plan_shorthand(a) for a in args if not a.startswith("-")]  # search=true: search.enabled=true


@pytest.mark.parametrize("args", COLLECTIVES, ids=[" ".join(a) for a in COLLECTIVES])
def test_every_collectives_command_is_accepted_as_typed(args):
    from harness.collectives import CollectivesConfig, placement_for
    from harness.collectives.config import register_defaults
    from harness.core.errors import Incompatible

    register_defaults()  # as `python -m harness.collectives` does before composing
    with hydra_context():
        config = compose_one(args, config_name="collectives").config
    CollectivesConfig.from_dict(config["collectives"])
    if names_missing_gpus(args):
        with pytest.raises(Incompatible, match="no visible GPU"):
            placement_for(config, probe_hardware())
    else:
        assert placement_for(config, probe_hardware()).world_size >= 1


def test_the_merge_command_works_with_its_placeholders_filled(tmp_path, monkeypatch):
    from harness import report

    commands = readme_commands("-m harness.report")
    merge = next(c for c in commands if "--baseline" in c)
    compare = next(c for c in commands if c[0] == "--compare")
    monkeypatch.chdir(tmp_path)
    for name, strategy, job in (("A", "single", "0"), ("B", "ddp", "0"), ("B", "single", "1")):
        folder = tmp_path / "runs" / "multirun" / name / job
        folder.mkdir(parents=True)
        windows = [{"end_iter": 20 * i, "seconds": 1.0, "cumulative_seconds": float(i), "warmup": i == 1, "loss": 1.0}
                   for i in (1, 2, 3)]
        folder.joinpath("results.json").write_text(json.dumps({
            "schema": 1, "status": "ok", "error": None, "strategy": strategy, "amp": "O0", "model": "m",
            "devices": ["cpu"], "global_batch": 8, "log_every": 20, "windows": windows, "throughput_img_s": 160.0,
            "memory": {"source": None, "per_device": [], "per_process": []}}))
    assert report.main(merge) == 0
    assert len(list(Path("runs/reports").glob("*/index.html"))) == 1
    assert compare[0] == "--compare" and report.main(compare) == 0  # single O0 ran in both
