"""The CLI's refusals: bad input is exit code 2 and one line on stderr, before any folder or worker exists."""

from __future__ import annotations

import logging
import logging.config
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO, TINY, describe, refused_before_start, run_cli
from omegaconf import OmegaConf

from harness import cli
from harness.core.amp_levels import LEVELS as AMP_LEVELS
from harness.core.config import CONF_DIR
from harness.core.errors import ConfigError
from harness.core.logs import add_file, setup_cli, warnings_to_log

# DDP, so that a wrongly started run would show "[ddp ..." progress lines and rank records.
DDP = ("strategy=ddp", "nprocs=2", *TINY, "iterations=20", "log_every=10")


def assert_refused(proc, tmp_path, *words: str) -> str:
    assert proc.returncode == cli.EXIT_BAD_INPUT, describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, describe(proc)
    line = lines[0]
    assert line.startswith("error: ")
    for word in words:
        assert word in line, (word, line)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "[ddp" not in proc.stdout  # no worker trained
    run_dir = tmp_path / "run"
    assert not run_dir.exists(), sorted(p.name for p in run_dir.rglob("*"))  # no results, no empty run folder
    return line


@pytest.mark.slow
def test_unknown_amp_level(tmp_path):
    proc, results = run_cli(*DDP, "amp=O4", tmp_path=tmp_path)
    assert results is None
    line = assert_refused(proc, tmp_path, "amp=O4", *AMP_LEVELS)
    assert "amp" in line.split("=")[0]


@pytest.mark.slow
def test_apex_without_apex_or_cuda(tmp_path):
    proc, results = run_cli(*DDP, "amp=O1", "amp.impl=apex", tmp_path=tmp_path)
    assert results is None
    assert_refused(proc, tmp_path, "apex")


# Refusals of a value in this process (what the real `python run.py` adds, no folder and no Traceback, is checked
# above and by test_bad_command_lines_leave_no_folder below)
def refused_line(overrides: tuple[str, ...], monkeypatch, capsys, *words: str) -> str:
    lines = refused_before_start(overrides, monkeypatch, capsys)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def test_bad_amp_dtype(monkeypatch, capsys):
    refused_line((*DDP, "amp=O2", "amp.dtype=int8"), monkeypatch, capsys, "amp.dtype=int8", "float16", "bfloat16")


def test_batch_not_divisible_by_the_workers(monkeypatch, capsys):
    refused_line(("strategy=ddp", "nprocs=2", "model=tiny_cnn", "data.image_size=8", "batch_size=7", "iterations=20",
                  "log_every=10"), monkeypatch, capsys, "batch_size=7", "multiple of the 2 workers", "6", "8")


def test_precheck_refuses_unknown_strategy(capsys):
    with pytest.raises(SystemExit) as info:
        cli.precheck(["strategy=nope", "amp=O1"])
    assert info.value.code == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "strategy=nope" in err[0] and "ddp" in err[0] and "single" in err[0]


def test_precheck_lets_good_overrides_and_flags_through(capsys):
    argv = cli.precheck(["-m", "strategy=single,ddp", "amp=O0,O1", "batch_size=8", "--multirun"])
    assert capsys.readouterr().err == ""
    assert argv == ["-m", "--multirun", "strategy=single,ddp", "amp=O0,O1", "batch_size=8", "sweep=none"]


def test_a_sweep_with_axes_of_its_own_sweeps_only_those(capsys):
    """Before: `-m strategy=ddp launcher=elastic,spawn` also swept the default grid's amp O0-O3: 8 runs."""
    from harness.compose import combinations, hydra_context

    argv = cli.precheck(["-m", "strategy=ddp", "launcher=elastic,spawn"])
    assert argv[-1] == "sweep=none"
    with hydra_context():
        runs = combinations(argv[1:], multirun=True)
    assert sorted(" ".join(sorted(r)) for r in runs) == ["launcher=elastic strategy=ddp sweep=none",
                                                        "launcher=spawn strategy=ddp sweep=none"]
    with hydra_context():  # no axis typed: the default grid, every strategy x every amp level
        grid = combinations([], multirun=True)
    assert len(grid) == 24 and {tuple(sorted(r)) for r in grid} >= {("amp=O2", "strategy=allreduce")}
    assert cli.precheck(["-m"]) == ["-m"]


BAD_COMMAND_LINES = {  # argv -> what the one line must say (the list, plus sweeps of them)
    "stratgy=ddp": ("stratgy=ddp is not allowed", "did you mean strategy?"),
    "+stratgy=ddp": ("stratgy=ddp is not allowed", "did you mean strategy?"),
    "-m stratgy=ddp,single": ("stratgy=ddp is not allowed", "did you mean strategy?"),
    "-m +stratgy=ddp,single": ("stratgy=ddp is not allowed", "did you mean strategy?"),
    "+strategy.foo=1": ("strategy.foo=1 is not allowed", "no such key"),
    "strategy=ddp strategy.bucket_cap_mb=abc": ("strategy.bucket_cap_mb=abc is not allowed", "a number"),
    "strategy=ddp +strategy.bucket_cap=5": ("strategy.bucket_cap=5", "did you mean strategy.bucket_cap_mb?"),
    "+model.foo=1": ("model.foo=1 is not allowed", "no such key"),
    "amp.impl=nosuch": ("amp.impl=nosuch is not allowed", "native, apex"),
    "optim=nosuch": ("optim=nosuch is not allowed", "adamw, sgd"),
    "optim.lr=abc": ("optim.lr=abc is not allowed", "a number"),
    "optim=adamw optim.betas=0.9": ("optim.betas=0.9 is not allowed", "a list"),
    "iterations=20": ("iterations=20 is not allowed", "at least 40"),
    "-m strategy=single,ddp batch_size=3": ("batch_size=3 is not allowed", "multiple of the 2 workers"),
    "-m amp=O0,O1 amp.loss_scale=fast": ("amp.loss_scale=fast is not allowed", "dynamic, auto"),
    # before: a Python UserWarning from the report at the sweep's end, and speedups against single O0
    "report.baseline=dpp:O0": ("report.baseline=dpp:O0 is not allowed", "a strategy of conf/strategy/ (allreduce,"),
    "-m strategy=single,ddp report.baseline=ddp:O7": ("report.baseline=ddp:O7 is not allowed", "O0, O1, O2, O3"),
    # every combination refused on this machine: before, exit 0 and a folder of 12 skipped rows
    "-m experiment=seed_blog": ("gpus=[0,1,3] is not allowed", "no visible GPU"),
}


@pytest.mark.parametrize("argv", list(BAD_COMMAND_LINES))
def test_bad_command_lines_are_one_line_and_exit_2_before_hydra(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.precheck([*argv.split(), "model=tiny_cnn"])
    assert info.value.code == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    for fragment in BAD_COMMAND_LINES[argv]:
        assert fragment in err[0], (fragment, err[0])


# A key unknown to its section: the closest key of the section as the run composes it, or the other choice of the
# group it belongs to; never the top-level list (whose "did you mean data.report?" sent users the wrong way).
SECTION_TYPOS = {
    "strategy=ddp strategy.comm_hok=bf16": (
        "strategy.comm_hok=bf16 is not allowed: no such key in strategy=ddp; did you mean strategy.comm_hook? "
        "the keys of strategy=ddp are backend, bucket_cap_mb, comm_hook, find_unused_parameters, "
        "gradient_as_bucket_view, powersgd_rank, powersgd_start_iter"),
    "data.num_worker=1": (  # data=synthetic (the default) has no loader workers: num_workers is data=loader's
        "data.num_worker=1 is not allowed: no such key in data=synthetic; did you mean data.num_workers? "
        "it belongs to data=loader (this run has data=synthetic); the keys of data=synthetic are image_size, name, "
        "num_classes, pool"),
    "data=loader data.num_worker=1": (
        "data.num_worker=1 is not allowed: no such key in data=loader; did you mean data.num_workers? the keys of "
        "data=loader are image_size, item_delay_ms, name, num_classes, num_workers, persistent_workers, pin_memory, "
        "prefetch_factor, root, size"),
    "data.root=/x": (
        "data.root=/x is not allowed: data.root belongs to data=loader (this run has data=synthetic); the keys of "
        "data=synthetic are image_size, name, num_classes, pool"),
    "-m strategy=ddp,zero strategy.comm_hok=bf16": (  # a sweep: the first combination's choice (ddp)
        "strategy.comm_hok=bf16 is not allowed: no such key in strategy=ddp; did you mean strategy.comm_hook?"),
    "timing.precison_pct=3": (  # a section that is no group
        "timing.precison_pct=3 is not allowed: no such key in timing; did you mean timing.precision_pct? the keys of "
        "timing are budget_s, busy_share, max_seconds, precision_pct"),
}


@pytest.mark.parametrize("argv", list(SECTION_TYPOS))
def test_a_key_unknown_to_its_section_is_named_within_the_section(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.precheck([*argv.split(), "model=tiny_cnn"])
    assert info.value.code == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert SECTION_TYPOS[argv] in err[0], err[0]
    assert "batch_size" not in err[0]  # not the top-level keys


# through a real `python run.py` (the same refusals in this process: test_bad_command_lines_are_one_line_and_exit_2_
# before_hydra and test_a_key_unknown_to_its_section_is_named_within_the_section): one a Hydra parse, one a sweep,
# one a value
@pytest.mark.slow
@pytest.mark.parametrize("argv", ["+stratgy=ddp", "-m stratgy=ddp,single", "data.root=/x"])
def test_bad_command_lines_leave_no_folder(argv, tmp_path):
    multirun = argv.startswith("-m")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "run.py", *argv.split(), *TINY,
                           f"hydra.{'sweep' if multirun else 'run'}.dir={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == cli.EXIT_BAD_INPUT, describe(proc)
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("override", ["strategy=nope", "amp=O4", "+model=vgg", "strategy=ddp,nope", "amp=_common"])
def test_unknown_group_choice_is_refused_before_composing(override):
    with pytest.raises(ConfigError) as info:
        cli.check_group_choices([override], CONF_DIR)
    group = override.lstrip("+").split("=")[0]
    assert info.value.key == group
    for option in cli.group_options(group, CONF_DIR):
        assert option in info.value.allowed
    assert "_common" not in info.value.allowed  # a shared part, not a choice


@pytest.mark.parametrize("override", ["strategy=ddp", "amp=O0,O1,O2,O3", "batch_size=3", "experiment=null",
                                      "strategy=glob(*)", "hydra.run.dir=x=y"])
def test_valid_or_non_group_overrides_pass_the_group_check(override):
    cli.check_group_choices([override], CONF_DIR)


def test_hw_resolver_picks_the_cpu_value_without_a_gpu():
    cli.register_resolvers()
    cli.register_resolvers()  # idempotent
    cfg = OmegaConf.create({"size": "${hw:224,32}", "model": "${hw:resnet101,resnet18}"})
    gpu = cli.has_gpu()
    assert (cfg.size, cfg.model) == ((224, "resnet101") if gpu else (32, "resnet18"))


def test_cpu_defaults_note_names_only_defaults_left_to_the_machine():
    cli.register_resolvers()
    cfg = OmegaConf.create({"model": {"name": "${hw:resnet101,resnet18}"}, "data": {"image_size": 8},
                            "batch_size": "${hw:128,32}"})
    note = cli.cpu_defaults_note(cfg)
    if cli.has_gpu():
        assert note is None
    else:
        assert "model.name=resnet18" in note and "batch_size=32" in note and "image_size" not in note
        assert cli.cpu_defaults_note(OmegaConf.create({"model": {"name": "tiny_cnn"}, "data": {"image_size": 8},
                                                       "batch_size": 8})) is None


@pytest.mark.slow
def test_occupied_run_folder_is_refused_before_hydra_touches_it(tmp_path):
    occupied = tmp_path / "old_run"
    (occupied / ".hydra").mkdir(parents=True)
    (occupied / "results.json").write_text('{"schema": 1, "status": "ok"}')
    (occupied / ".hydra" / "config.yaml").write_text("sentinel")
    before = {p: p.stat().st_mtime_ns for p in occupied.rglob("*")}
    proc = subprocess.run([sys.executable, "run.py", "model=tiny_cnn", f"hydra.run.dir={occupied}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "hydra.run.dir" in lines[0] and "results.json" in lines[0]
    assert {p: p.stat().st_mtime_ns for p in occupied.rglob("*")} == before
    assert (occupied / ".hydra" / "config.yaml").read_text() == "sentinel"


def test_the_prediction_lines_name_every_setting_the_sweep_varies():
    """`-m search=true` predicted "single O0" three times (grad_accum 1, 2, 4): each line names its micro-batch."""
    predicted = [(("strategy=single", "amp=O0", f"grad_accum={g}", "search.enabled=true"), "single O0") for g in (1, 2, 4)]
    predicted.append((("strategy=ddp", "amp=O1", "grad_accum=1", "search.enabled=true"), "ddp O1"))
    assert cli.prediction_names(predicted) == ["single O0 grad_accum=1", "single O0 grad_accum=2",
                                               "single O0 grad_accum=4", "ddp O1 grad_accum=1"]


LIBRARY_WARNING = "FSDP2-wrapped module (Block) returned a view tensor"  # what a search printed between its lines


@contextmanager
def logging_as(set_up: Callable[[Path], None], log_file: Path) -> Iterator[None]:
    """Logging as `set_up` leaves it, with Python's warnings captured (run.py: warnings_to_log); pytest's own
    handlers and the warnings' route restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        set_up(log_file)
        warnings_to_log()
        yield
    finally:
        logging.captureWarnings(False)
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def hydra_job_logging(log_file: Path) -> None:
    """conf/hydra/job_logging/harness.yaml, as Hydra applies it to a job (its run.log here at `log_file`)."""
    conf = OmegaConf.load(CONF_DIR / "hydra" / "job_logging" / "harness.yaml")
    conf.handlers.file.filename = str(log_file)
    logging.config.dictConfig(OmegaConf.to_container(conf))


def cli_with_log(log_file: Path) -> None:
    """setup_cli and a log file beside it: plan=true's and a search on a preset's plan.log."""
    setup_cli()
    add_file(log_file)


@pytest.mark.parametrize("set_up", [hydra_job_logging, cli_with_log], ids=["hydra job", "plan"])
def test_a_librarys_warning_goes_to_the_log_file_not_the_terminal(set_up, tmp_path, capsys):
    """Issue 53: FSDP's UserWarning landed between a search's progress lines. A library's Python warning is for
    the log file; the harness's own warnings (through logging) still reach the terminal."""
    log_file = tmp_path / "run.log"
    with logging_as(set_up, log_file):
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn(LIBRARY_WARNING, UserWarning, stacklevel=1)
        logging.getLogger("harness.test").warning("the harness's own warning")
    terminal = capsys.readouterr()
    assert LIBRARY_WARNING not in terminal.out + terminal.err
    assert terminal.err.splitlines() == ["warning: the harness's own warning"]
    log = log_file.read_text()
    assert LIBRARY_WARNING in log and "UserWarning" in log and "the harness's own warning" in log


FORK_SERVER_IDLE = """
import time, psutil
from multiprocessing import forkserver
from harness import cli
from harness.launch.launcher import preload_forkserver
preload_forkserver()
cli.start_fork_server()
server = psutil.Process(forkserver._forkserver._forkserver_pid)
before = sum(server.cpu_times()[:2])
time.sleep(0.5)
print(sum(server.cpu_times()[:2]) - before)
"""


@pytest.mark.slow
def test_the_fork_server_has_imported_before_the_predictions_are_timed():
    """start_fork_server returns once the server has imported what it preloads (torch: a second or more of CPU), so
    the parent's calibrations that follow have the cores to themselves: the server uses next to no CPU in the half
    second after (it used most of a core: a pipeline predicted 10-25x slow, flagged busy)."""
    done = subprocess.run([sys.executable, "-c", FORK_SERVER_IDLE], capture_output=True, text=True, timeout=120,
                          cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) < 0.1, done.stdout
