"""The command line of `run.py`: everything refused before Hydra starts, the Hydra task, and how the
outcome becomes an exit code."""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from harness.compose import (
    NO_GRID,
    SWEEP_GROUP,
    Composed,
    combinations,
    compose_one,
    has_gpu,
    hydra_context,
    register_resolvers,
    typed_sweep_axes,
)
from harness.core.config import CONF_DIR, RunConfig
from harness.core.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_RUN_FAILED, ConfigError, Incompatible

if TYPE_CHECKING:
    from harness.core.results import RunRecord
    from harness.launch.checked import Checked

log = logging.getLogger(__name__)

AUTO_KEYS = ("model.name", "data.image_size", "batch_size", "iterations")
RUN_MARKERS = ("results.json", ".hydra", "ranks", "multirun.yaml")  # what a started run or sweep leaves

__all__ = ["EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "EXIT_RUN_FAILED", "precheck", "register_resolvers", "task"]


# ---- before Hydra: every combination composed and checked, or one line and exit 2 ----

def precheck(argv: Sequence[str]) -> list[str]:
    """The command line as Hydra should get it, once every run it describes has been composed and checked
    (keys, types, ranges, placement on this machine). Otherwise one line, exit 2, nothing written.

    A sweep that types an axis of its own (`-m launcher=elastic,spawn`) sweeps only what it typed:
    `sweep=none` is added, so conf/sweep/'s default grid does not multiply it."""
    flags = [a for a in argv if a.startswith("-")]
    overrides = [plan_shorthand(a) for a in argv if not a.startswith("-")]
    multirun = bool({"-m", "--multirun"} & set(flags))
    try:
        check_output_dirs(overrides)
        check_group_choices(overrides)
        check_round_keys(overrides)
        if multirun and typed_sweep_axes(overrides) and not any(_key(o) == SWEEP_GROUP for o in overrides):
            overrides.append(f"{SWEEP_GROUP}={NO_GRID}")
        with hydra_context():  # every combination composed once: for plan=true, or checked for a run
            if search_requested(overrides):
                return [*flags, *search_precheck(overrides, multirun)]
            composed = [(combo, compose_one(combo)) for combo in combinations(overrides, multirun)]
            if composed and composed[0][1].run.plan.enabled:
                from harness.planning import plan_command

                sys.exit(plan_command([(combo, one.run) for combo, one in composed]))
            check_runs(composed, multirun)
            if multirun:  # the rounds sweeper launches these combinations instead of expanding the grid again
                from harness.launch import checked

                checked.remember_sweep(overrides)
    except ConfigError as error:
        refuse(error)
    return [*flags, *overrides]


def plan_shorthand(override: str) -> str:
    """`plan=true` is short for `plan.enabled=true`, so that `plan.hardware=...` can follow it (Hydra cannot set a
    key inside a value it has just made a bool); `search=true` for `search.enabled=true` alike."""
    key, sep, value = override.partition("=")
    if sep and key in ("plan", "search") and value in ("true", "false"):
        return f"{key}.enabled={value}"
    return override


def search_requested(overrides: Sequence[str]) -> bool:
    from harness.search.shortlist import requested

    return requested(overrides)


def search_precheck(overrides: list[str], multirun: bool) -> list[str]:
    """`-m search=true`: the space composed, checked, planned and predicted (check_runs), then pruned by the
    predictions (harness.search.shortlist); Hydra gets the command line with no grid of its own, and the rounds
    sweeper races what was kept."""
    from harness.search import shortlist
    from harness.search.space import swept

    base = compose_one([*[o for o in overrides if _key(o) != SWEEP_GROUP and swept(o) is None],
                        f"{SWEEP_GROUP}={NO_GRID}"])
    if base.run.plan.enabled and not multirun:
        raise ConfigError("search", "true", "with -m: a search predicts many combinations (python run.py -m "
                          f"search=true plan=true plan.hardware={base.run.plan.hardware} ...)")
    if not multirun:
        raise ConfigError("search", "true", "with -m: a search runs many combinations (python run.py -m search=true)")
    if base.run.plan.enabled:  # a layout found without running: predicted on plan.hardware, nothing trained
        sys.exit(search_on_preset(overrides, base.run))
    candidates = shortlist.space(overrides, base.run.search)
    check_runs([(combo, compose_one(combo)) for combo in candidates], multirun=True)
    shortlist.settle(candidates, base.run.search, " ".join(["run.py", "-m", *overrides]))
    return [*[o for o in overrides if _key(o) != SWEEP_GROUP], f"{SWEEP_GROUP}={NO_GRID}"]


def search_on_preset(overrides: list[str], base: RunConfig) -> int:
    """`-m search=true plan=true plan.hardware=<preset>`: every candidate of the space predicted on the preset as
    plan=true predicts (harness.search.preset), nothing trained, no worker, no sweep; the answer, and plan.json
    (its rows and a `search` section), plan.md and plan.log in runs/plan/<time>/. 0; a space where nothing is
    predicted to fit is bad input (ConfigError: one line, exit 2), its predictions kept."""
    import json
    import time

    from harness import planning
    from harness.launch.on_preset import predict_on
    from harness.launch.placement import usable_cores
    from harness.prediction.hardware import LOCAL
    from harness.search import preset

    planning.check_plan_presets([base])
    found = preset.preset_space(overrides, base)
    started = time.perf_counter()
    cores, link = usable_cores(), planning.measure_link if found.hardware == LOCAL else None

    def predict(combo: list[str], cfg: RunConfig) -> dict[str, Any]:
        return {**predict_on(cfg, found.hardware, cores, link), **planning.sample_unit(cfg)}

    figure = planning.figure  # a row's predicted rate and band, in its unit

    with planning.plan_folder() as out:
        log.info("search on %s: %d candidates, predicted one by one (nothing trained); %s", found.hardware,
                 len(found.candidates), "; ".join(found.axes))
        rows = preset.predict_all(found, predict)
        said = preset.answer(rows, found.hardware, found.nodes, base.verdict.margin, figure)
        took = time.perf_counter() - started
        (out / "plan.json").write_text(json.dumps({"kind": "plan", "rows": rows, "seconds": took,
                                                   "search": said.as_json()}, indent=1, default=str))
        labelled = [{**r, "strategy": r["name"], "amp": "", "variant": ""} for r in rows]  # the tables name each row
        tables = planning.tables(labelled).rstrip()
        (out / "plan.md").write_text("\n".join([*said.markdown(figure), "```", tables, "```", ""]))
        if said.winner is None:
            raise preset.nothing_fits(said, str(out / "plan.md"))
        for line in said.lines:
            log.info("%s", line)
        log.info("search: %d candidates in %.1f s, nothing trained: %s", len(rows), took, out / "plan.md")
    return 0


RUN_OVERHEAD_S = 4.0  # a CPU run's wall time beyond its windows (process start, set-up, record): benchmark 9


def check_runs(composed: Sequence[tuple[list[str], Composed]], multirun: bool) -> None:
    """Place and predict every combination; in a sweep an Incompatible one is left to become a skipped row,
    unless every one is (e.g. experiment=seed_blog's GPUs on a machine without them): then the first reason.
    What takes more than a moment before the first run (the link's measurement, the predictions) says so as it
    goes, and ends with an estimate of the sweep's time."""
    import dataclasses
    import time

    from harness.launch import checked
    from harness.launch.checked import Checked
    from harness.launch.decide import run_plan
    from harness.launch.launcher import preload_forkserver
    from harness.launch.placement import probe_hardware
    from harness.launch.runner import predict_run
    from harness.planning import check_plan_presets, ensure_link

    hw = probe_hardware()
    quiet_kineto(hw.has_gpu)
    checked.forget_all()
    decided: dict[tuple[str, ...], Checked] = {}  # each combination, as its job will find it
    for combo, one in composed:
        try:
            decided[tuple(combo)] = Checked(one.run, one.config,
                                            plan=run_plan(one.run, hw, resolved=one.config, in_sweep=multirun))
        except Incompatible as error:
            if not multirun:
                raise
            decided[tuple(combo)] = Checked(one.run, one.config, refused=error)
    plans = [c.plan for c in decided.values() if c.plan is not None]
    if not plans:  # a sweep of rows all refused measures nothing: bad input, not a folder of skips
        raise next(c.refused for c in decided.values() if c.refused is not None)
    configs = [one.run for _, one in composed]
    check_plan_presets(configs)
    runnable = [p for p in plans if p.will_run]
    predicted = [(combo, c) for combo, c in decided.items()
                 if c.plan is not None and c.plan.will_run and c.config.plan.predict]
    ranks = [c.plan.placement.world_size for _, c in predicted if c.plan.strategy_cls.one_process_per_device]
    if predicted:
        from harness.core.logs import setup_cli

        setup_cli()
        log.info("before the first run: %d combination%s predicted on this machine (each traced and calibrated once; "
                 "plan.predict=false skips this)", len(predicted), "s" if len(predicted) != 1 else "")
    preload_forkserver()  # the calibration child and then the runs fork from one server that imported torch once
    if predicted or forks_ranks_here(composed, decided):
        start_fork_server()
    # every prediction made now, before any worker exists (the fork server has only imported, and waits): each run
    # starts from its plan's, and no calibration is timed beside another process
    seconds: list[float] = []
    started = time.monotonic()
    names = prediction_names([(combo, one.plan.label) for combo, one in predicted])
    try:
        ensure_link(max(ranks, default=1), hw.has_gpu,
                    max((c.config.plan.link_repeats for _, c in predicted), default=1))
        for index, (combo, one) in enumerate(predicted, 1):
            began = time.monotonic()
            plan = one.plan.predicted(predict_run(one.plan, quiet=True))
            decided[combo] = dataclasses.replace(one, plan=plan)
            if plan.prediction is not None and plan.config.iterations and plan.prediction.fits \
                    and math.isfinite(plan.prediction.s_per_iteration) and plan.prediction.s_per_iteration > 0:
                seconds.append(plan.prediction.s_per_iteration * plan.config.iterations)  # a misfit is not run
            log.info("  predicted %d/%d: %s (%.1f s)", index, len(predicted), names[index - 1],
                     time.monotonic() - began)
    except KeyboardInterrupt:  # the calibration child ignores it: ended now, not waited for (shutdown below)
        from harness.core.stops import end_descendants

        end_descendants()
        raise
    finally:
        from harness.prediction.calibrate import shutdown

        shutdown()  # the calibration child holds no device while runs are measured
    for combo, one in decided.items():
        checked.remember(combo, one)
    if predicted:
        log.info("predictions took %.0f s. %s", time.monotonic() - started,
                 sweep_estimate(configs[0], len(runnable), seconds, multirun))


def forks_ranks_here(composed: Sequence[tuple[list[str], Composed]], decided: Mapping[tuple[str, ...], Checked]) -> bool:
    """A run of this command forks its ranks from this process's fork server (not from a job process of its own:
    `hydra/launcher=`)."""
    if any(_key(o) == "hydra/launcher" for combo, _ in composed for o in combo):
        return False
    return any(c.plan is not None and c.plan.will_run and c.plan.launched
               and c.plan.config.launcher.start_method == "forkserver" for c in decided.values())


def start_fork_server() -> None:
    """The fork server the calibration child and the runs fork from, started now with Ctrl-C ignored: it and what
    it forks leave a Ctrl-C at the terminal to this process (ranks install their own handlers, StopRequest), instead
    of each printing a traceback of the import it was in. Returns once it has imported what it preloads (it forks a
    process that does nothing, which it does only then): a calibration timed in this process meanwhile shared the
    cores with that import (a pipeline's, timed here, came out 10-25x slow, flagged busy: 0.8-0.9 cores)."""
    import multiprocessing
    from multiprocessing import forkserver

    from harness.core.stops import sigint_ignored

    if "forkserver" in multiprocessing.get_all_start_methods():
        with sigint_ignored():
            forkserver.ensure_running()
        ready = multiprocessing.get_context("forkserver").Process(target=int, daemon=True)  # a Ctrl-C here is taken
        ready.start()
        ready.join()


def quiet_kineto(gpu: bool) -> None:
    """Kineto's C++ lines on a CPU machine kept off the terminal, in this process and every one it starts from
    now on (harness.profile.rank.quiet_kineto): before the fork server starts, and before a run profiles."""
    from harness.profile.rank import quiet_kineto as quiet

    quiet("cuda" if gpu else "cpu")


def sweep_estimate(cfg: RunConfig, runs: int, timed: Sequence[float], multirun: bool) -> str:
    """`about 3 min`: a round from the predicted timed loops plus each run's start-up, times the rounds."""
    if not timed:
        return ""
    per_run = sum(timed) / len(timed) + RUN_OVERHEAD_S
    round_s = per_run * runs
    if not multirun:
        return f"The run: about {per_run * (cfg.repeat or 1):.0f} s."
    if cfg.repeat:
        total = round_s * cfg.repeat
        how = f"{cfg.repeat} rounds (repeat={cfg.repeat})"
    else:
        key, budget = ("search.budget_s", cfg.search.budget_s) if cfg.search.enabled else \
            ("timing.budget_s", cfg.timing.budget_s)
        total = max(2 * round_s, min(budget, round_s * 100))
        how = f"racing within {key}={budget:g} s, two rounds at least"
    return (f"The sweep: {runs} runs a round, about {round_s:.0f} s each round (predicted loops + about "
            f"{RUN_OVERHEAD_S:.0f} s a run), {how}: about {max(1, round(total / 60))} min.")


def refuse(error: Exception) -> None:
    from harness.core.logs import refusals

    refusals().error("%s", error)
    sys.exit(EXIT_BAD_INPUT)


def _key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """A group's choices (files starting with `_` are shared parts, not choices)."""
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml") if not p.stem.startswith("_"))


def check_group_choices(overrides: Sequence[str], conf_dir: Path = CONF_DIR) -> None:
    """`strategy=nope` refused with the choices there are (Hydra's own error is many lines)."""
    groups = {p.name for p in conf_dir.iterdir() if p.is_dir() and p.name != "hydra"}
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if not sep or key not in groups:
            continue
        options = group_options(key, conf_dir)
        for choice in _split_sweep(value):
            if choice not in options and choice != "null":
                raise ConfigError(key, choice, "one of " + ", ".join(options))


def prediction_names(predicted: Sequence[tuple[Sequence[str], str]]) -> list[str]:
    """`single O0 grad_accum=2`: each predicted combination (its overrides, its plan's `strategy amp` label) as the
    sweep's logs will name it, with every setting the sweep varies."""
    from harness.verdict.rounds import combination_names

    return combination_names([list(combo) for combo, _ in predicted], lambda i: predicted[i][1])


ROUND_KEYS = ("repeat", "timing.budget_s")  # how many rounds a sweep runs: one value for the whole sweep


def check_round_keys(overrides: Sequence[str]) -> None:
    """`round` is the sweep's to set; the keys that decide the rounds take one value, not a sweep of them."""
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if key in ("round", "place", "after"):
            raise ConfigError(key, value, "left to the sweep, which numbers its rounds and orders them itself "
                              "(repeat=N asks for N rounds)")
        if key in ROUND_KEYS and len(_split_sweep(value)) > 1:
            raise ConfigError(key, value, "one value: every combination of a sweep runs the same rounds")


def check_output_dirs(overrides: Sequence[str]) -> None:
    """A run never lands in a folder that already holds one (finished or not)."""
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and key in ("hydra.run.dir", "hydra.sweep.dir") and "${" not in value and Path(value).is_dir():
            held = next((p for marker in RUN_MARKERS for p in Path(value).rglob(marker)), None)
            if held is not None:
                raise ConfigError(key, value, f"a folder that holds no run yet ({held} exists); "
                                  "every run gets a folder of its own")


def _split_sweep(value: str) -> list[str]:
    """`a,b` in a multirun override means two choices; anything fancier is left to Hydra."""
    if any(c in value for c in "()[]{}"):
        return []
    return [v.strip() for v in value.split(",") if v.strip()]


# ---- under torchrun: this process is one worker ----

def started_by_torchrun() -> bool:
    """torchrun's environment (read here: importing harness.launch.torchrun to ask costs seconds of imports
    before a refusal that needs none of them)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def torchrun_worker(argv: Sequence[str]) -> int:
    from harness.launch.torchrun import run_worker

    try:
        return run_worker([a for a in argv if not a.startswith("-")])
    except ConfigError as error:
        if os.environ.get("RANK") == "0":
            from harness.core.logs import refusals

            refusals().error("%s", error)
        return EXIT_BAD_INPUT


# ---- the Hydra task: one job, one run ----

def cpu_defaults_note(cfg: DictConfig) -> str | None:
    if has_gpu():
        return None
    auto = [f"{key}={OmegaConf.select(cfg, key)}" for key in AUTO_KEYS if _is_interpolation(cfg, key)]
    if not auto:
        return None
    return ("No GPU found: CPU-sized defaults " + ", ".join(auto) +
            " (the GPU defaults are resnet101, 224 px, batch 128, 100 iterations); any explicit override wins.")


def _is_interpolation(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return node is not None and leaf in node and OmegaConf.is_interpolation(node, leaf)


def task(cfg: DictConfig) -> RunRecord | None:
    """One Hydra job = one run. Never raises for a run that failed: a sweep must go on."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from harness.launch import checked
    from harness.launch.decide import plan_from_dict
    from harness.launch.runner import Unavailable, execute

    hydra_cfg = HydraConfig.get()
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    quiet_kineto(has_gpu())  # also for a job in a process of its own, which run.py's checks never ran in
    run_dir = Path(hydra_cfg.runtime.output_dir)
    note = cpu_defaults_note(cfg)
    if note:
        log.info("%s", note)
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    strategy_name = str(hydra_cfg.runtime.choices["strategy"])
    overrides = list(hydra_cfg.overrides.task)
    # In a sweep the sweeper runs the rounds (every combination once before any runs again): one run per job
    repeat = 1 if in_sweep else int(cfg_dict.get("repeat") or 1)
    all_results = []
    known = checked.find(overrides, cfg_dict)  # the plan run.py made before Hydra started, in this process
    try:
        if known is not None and known.refused is not None:
            raise known.refused
        plan = known.plan if known is not None and known.plan is not None else \
            plan_from_dict(cfg_dict, strategy_name, in_sweep=in_sweep)
        for index in range(repeat):
            folder = run_dir if repeat == 1 else run_dir / f"repeat-{index}"
            label = f"repeat {index + 1}/{repeat}" if repeat > 1 else ""
            all_results.append(execute(plan, folder, in_sweep=in_sweep, overrides=overrides, repeat_label=label))
    except (ConfigError, Unavailable) as error:
        if in_sweep:
            return _record_refused(cfg_dict, strategy_name, run_dir, overrides, error,
                                   known.config if known is not None else None)
        _remove_if_empty_run(run_dir)
        refuse(error)
    except KeyboardInterrupt as stop:  # execute's names the run it stopped; a bare one came after the run ended
        from harness.core.stops import INTERRUPTED_BETWEEN_RUNS, end_descendants

        log.warning("%s", "interrupted: partial results written with status 'interrupted'" if str(stop)
                    else INTERRUPTED_BETWEEN_RUNS)
        if in_sweep and job_of_its_own():  # the signal ended this job, not the sweep: a row like any other
            return None
        end_descendants()  # the ranks are stopped: the fork server, and a rank it was still starting
        if in_sweep:  # the sweep stops here and Hydra skips on_multirun_end: report what finished now
            from harness.report.callbacks import report_sweep

            report_sweep(Path(hydra_cfg.sweep.dir), cfg_dict.get("report", {}).get("baseline"))
        sys.exit(EXIT_INTERRUPTED)
    if not in_sweep and any(r.status not in ("ok", "skipped") for r in all_results):
        sys.exit(EXIT_RUN_FAILED)
    return all_results[-1]


def job_of_its_own() -> bool:
    """This combination runs as a submitit job (SLURM or local), a process of its own that a signal can end
    alone; the submitting process goes on with the sweep and builds its report."""
    return "SUBMITIT_EXECUTOR" in os.environ


def _record_refused(cfg_dict: dict[str, Any], strategy_name: str, run_dir: Path, overrides: list[str],
                    error: Exception, config: RunConfig | None) -> RunRecord:
    """In a sweep a combination that cannot run is a row with its reason, not the end of the sweep."""
    from harness.launch.runner import Unavailable

    status = "skipped" if isinstance(error, Unavailable | Incompatible) else "failed"
    return record_not_run(cfg_dict, strategy_name, run_dir, overrides, status, str(error), config)


def record_not_run(cfg_dict: dict[str, Any], strategy_name: str, run_dir: Path, overrides: list[str],
                   status: str, error: str, config: RunConfig | None = None) -> RunRecord:
    """results.json for a combination that measured nothing (refused, or its job lost), from its config."""
    from harness.core.results import RunRecord, write_results  # noqa: F811 (the annotation's, imported lazily)

    model = cfg_dict["model"].get("name") or str(cfg_dict["model"].get("_target_", "?")).rpartition(".")[2]
    iterations = cfg_dict["iterations"]  # a number, or "auto"/None for iterations=auto
    known: dict[str, Any] = {"global_batch": cfg_dict["batch_size"],
                             "iterations": iterations if isinstance(iterations, int) else None,
                             "iterations_requested": cfg_dict["iterations"], "log_every": cfg_dict["log_every"],
                             "overrides": overrides, "config": cfg_dict}
    from harness.launch.runner import variant_fields

    try:  # an Incompatible combination is a valid config: its row is labelled like the runs beside it
        known.update(variant_fields(config or RunConfig.from_dict(cfg_dict, strategy_name)).as_fields())
    except ConfigError:
        pass
    record = RunRecord.not_run(status=status, error=error, strategy=strategy_name, amp=cfg_dict["amp"]["level"],
                               model=model, **known)
    write_results(run_dir, record)
    log.info("[%s %s] %s: %s", strategy_name, record.amp, status, error)
    return record


def _remove_if_empty_run(run_dir: Path) -> None:
    """Hydra made this folder for a run refused before starting: leave no empty run behind."""
    leftovers = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
    if leftovers <= {".hydra", "run.log"} and not (run_dir / "results.json").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
