"""`hydra/sweeper=rounds` (the harness's default): Hydra's basic sweeper's grid, run in rounds with racing
(harness/verdict/rounds.py says how). The grid is the one run.py's pre-check expanded, composed and checked
(harness.launch.checked.combinations), not expanded again. Hydra takes sweepers only from the `hydra_plugins`
package and imports every module here when it starts: the harness is imported lazily."""

# No `from __future__ import annotations`: Hydra loads this module outside sys.modules, where dataclasses
# cannot resolve string annotations, and OmegaConf needs the real types of the config below.
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional  # noqa: UP035 (real types for OmegaConf, see above)

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf


@dataclass
class RoundsSweeperConf:
    _target_: str = "hydra_plugins.harness_rounds_sweeper.RoundsSweeper"
    max_batch_size: Optional[int] = None  # noqa: UP045
    params: Optional[Dict[str, str]] = None  # noqa: UP006, UP045


ConfigStore.instance().store(group="hydra/sweeper", name="rounds", node=RoundsSweeperConf,
                             provider="parallel-harness")


class RoundsSweeper(BasicSweeper):
    def sweep(self, arguments: List[str]) -> Any:  # noqa: UP006
        from harness.core.stops import ctrl_c_lost
        from harness.launch.checked import sweep_settings
        from harness.search import shortlist
        from harness.verdict.rounds import combination_names, run_rounds
        from harness.verdict.sweep_record import SweepRecord

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        search = shortlist.current()  # `-m search=true`: its record follows the rounds (search.json)
        combinations = self.combinations(arguments)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns: List[Any] = []  # noqa: UP006
        size = self.max_batch_size or None

        def launch(jobs: List[List[str]], first: int) -> List[Any]:  # noqa: UP006, UP045
            values: List[Any] = []  # noqa: UP006, UP045
            for start in range(0, len(jobs), size or len(jobs)):
                if ctrl_c_lost():  # no further job starts (run.py says so in one line)
                    raise KeyboardInterrupt
                chunk = jobs[start:start + (size or len(jobs))]
                done = self.launcher.launch(chunk, initial_job_idx=first + start)
                returns.append(done)
                values += [r.return_value for r in done]  # a job that raised raises here, as in the basic sweeper
            return values

        def describe(index: int) -> str:
            return " ".join(o.partition("=")[2] for o in combinations[index]
                            if o.partition("=")[0] in ("strategy", "amp")) or " ".join(combinations[index])

        template = OmegaConf.to_container(self.config.hydra.sweep, resolve=False)["subdir"]
        settings = sweep_settings(self.config)  # typed, as checked before the sweep
        budget_s = search.budget_s if search is not None else settings.timing.budget_s
        names = combination_names(combinations, describe)  # what the logs and rounds.json call each combination
        plan = SweepRecord(combinations=combinations, names=names,
                         repeat=settings.repeat, budget_s=budget_s, margin=settings.verdict.margin,
                         command=" ".join(["run.py", "-m", *arguments]))

        def progress(outcome: Any) -> None:
            plan.update(outcome)
            plan.write(sweep_dir)
            if search is not None:
                search.rounds, search.runs, search.ended_by = outcome.rounds, outcome.runs, outcome.ended_by
                search.write(sweep_dir)

        try:
            run_rounds(combinations, launch, settings.repeat, budget_s, str(template), names.__getitem__,
                       margin=settings.verdict.margin, progress=progress)
        except KeyboardInterrupt:  # between jobs (a job stopped mid-run reports itself): report what finished
            if next(sweep_dir.rglob("results.json"), None) is not None:
                from harness.report.callbacks import report_sweep

                report_sweep(sweep_dir, settings.report.baseline)
            raise
        if search is not None:
            search.ended_at = time.time()
            search.write(sweep_dir)
        return returns

    def combinations(self, arguments: List[str]) -> List[List[str]]:  # noqa: UP006
        """What the sweep runs, in order (job numbers follow it). `-m search=true`: the candidates its predictions
        kept. Otherwise the grid as run.py's pre-check expanded, composed and checked it, so nothing is expanded
        again. Only for a sweep this process did not check (one started other than through run.py: Hydra's own
        entry, a test's) is Hydra's grid (conf/sweep/'s params and the typed overrides) expanded here, in the same
        order; its jobs then each check their own config (harness.cli.task)."""
        from harness.compose import expand
        from harness.launch import checked
        from harness.search import shortlist

        search = shortlist.current()
        if search is not None:
            return [list(c) for c in search.kept]
        known = checked.combinations(arguments)
        if known is not None:
            return known
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        return expand(parser.parse_overrides([*self._parse_config(), *arguments]))
