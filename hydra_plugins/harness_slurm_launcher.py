"""`hydra/launcher=slurm`'s launcher: hydra-submitit-launcher's SlurmLauncher, with every way SLURM ends a job
a row of the sweep (harness/launch/submitit_jobs.py says how). Hydra takes launchers only from the
`hydra_plugins` package, and imports every module here when it starts: the harness is imported lazily."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _PluginSlurmLauncher
except ImportError:  # the `slurm` extra is not installed: nothing to offer
    _PluginSlurmLauncher = None

if _PluginSlurmLauncher is not None:
    from hydra.core.utils import JobReturn

    class SlurmLauncher(_PluginSlurmLauncher):  # type: ignore[misc, valid-type]
        def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
            """In the job's process, as early as the harness gets control: stop signals held from here on."""
            import signal

            from harness.launch.runner import hold_stop_signals

            hold_stop_signals()
            # submitit logs a warning for every SIGCONT, and SLURM sends one with each of its signals
            signal.signal(signal.SIGCONT, signal.SIG_DFL)
            return super().__call__(*args, **kwargs)

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            from harness.cli import record_not_run
            from harness.launch.submitit_jobs import lost_jobs_as_rows, record_lost, watch_without_accounting

            watch_without_accounting()
            with lost_jobs_as_rows(lambda job, error: record_lost(self, job, error, record_not_run)):
                return super().launch(job_overrides, initial_job_idx)
