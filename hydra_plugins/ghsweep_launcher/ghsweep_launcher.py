"""The launchers ghsweep's profiles name; Hydra instantiates launchers only from hydra_plugins.

Hydra imports every module under hydra_plugins at each command's plugin scan (`--help` included),
so these classes import ghsweep's launch code (MLflow, submitit) only when they launch or are
signalled, as Hydra's own plugins do. What they add to hydra-submitit-launcher's launchers is in
ghsweep.launch.slurm.submitit_launcher.
"""

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from hydra._internal.core_plugins import basic_launcher
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, setup_globals
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(basic_launcher.__name__)  # Hydra's launch lines, under Hydra's name


class _GhsweepSubmitit(plugin.BaseSubmititLauncher):
    """The plugin's launcher with ghsweep's launch(), checkpoint() and remote side (__call__, run in the
    job: each combination started as the basic launcher starts it); its config keys stay the plugin's."""

    def checkpoint(self, *args: Any, **kwargs: Any) -> NoReturn:
        from ghsweep.launch.slurm import submitit_launcher

        submitit_launcher.checkpoint(self)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from ghsweep.launch.slurm import submitit_launcher

        return submitit_launcher.launch(self, job_overrides, initial_job_idx)

    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
    ) -> JobReturn:
        from ghsweep.launch.slurm import submitit_launcher

        return submitit_launcher.run_submitted(self, sweep_overrides, job_num, singleton_state)


class LocalLauncher(_GhsweepSubmitit):
    _EXECUTOR = plugin.LocalLauncher._EXECUTOR


class SlurmLauncher(_GhsweepSubmitit):
    _EXECUTOR = plugin.SlurmLauncher._EXECUTOR


class BasicLauncher(basic_launcher.BasicLauncher):
    """Hydra's basic launcher (one combination after another, in this process) taking ghsweep's
    `retries` key, which each job reads (ghsweep.launch.job); what follows each worker runs while the
    next combination starts (ghsweep.launch.followups), all of it done before launch() returns."""

    def __init__(self, retries: int = 0) -> None:
        super().__init__()

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from ghsweep.launch import compile_ahead, followups

        assert self.hydra_context is not None and self.config is not None
        with followups.overlapped():
            # Each combination is composed once, here: compile_ahead reads them all before the first runs.
            loader = self.hydra_context.config_loader
            composed = [loader.load_sweep_config(self.config, list(overrides)) for overrides in job_overrides]
            if OmegaConf.select(self.config, "worker.compile_ahead") is True and not self.config.get("dry_run"):
                compile_ahead.start(composed, Path(self.config.hydra.sweep.dir))
            return self._launch(job_overrides, composed, initial_job_idx)

    def _launch(
        self, job_overrides: Sequence[Sequence[str]], composed: Sequence[DictConfig], initial_job_idx: int
    ) -> list[JobReturn]:
        """Hydra's basic launch of the combinations `composed` from `job_overrides`, but a job Hydra
        cannot start is recorded FAILED and the next one runs (ghsweep.launch.job.start_job): in
        Hydra's, its exception ends the sweep."""
        from ghsweep.launch.job import start_job

        setup_globals()
        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        log.info(f"Launching {len(job_overrides)} jobs locally")
        runs = []
        for idx, (overrides, sweep_config) in enumerate(zip(job_overrides, composed, strict=True), initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = sweep_config.hydra.job.num = idx
            runs.append(start_job(self.hydra_context, self.task_function, sweep_config))
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return runs
