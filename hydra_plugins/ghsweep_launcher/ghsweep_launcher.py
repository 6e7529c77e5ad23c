"""The launchers ghsweep's profiles name; Hydra instantiates launchers only from hydra_plugins.

Hydra imports every module under hydra_plugins at each command's plugin scan (`--help` included),
so these classes import ghsweep's launch code (MLflow, submitit) only when they launch or are
signalled, as Hydra's own plugins do. What they add to hydra-submitit-launcher's launchers is in
ghsweep.launch.submitit_launcher.
"""

from collections.abc import Sequence
from typing import Any, NoReturn

from hydra._internal.core_plugins import basic_launcher
from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin


class _GhsweepSubmitit(plugin.BaseSubmititLauncher):
    """The plugin's launcher with ghsweep's launch() and checkpoint(); its config keys and remote side
    (__call__) stay the plugin's."""

    def checkpoint(self, *args: Any, **kwargs: Any) -> NoReturn:
        from ghsweep.launch import submitit_launcher

        submitit_launcher.checkpoint(self)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from ghsweep.launch import submitit_launcher

        return submitit_launcher.launch(self, job_overrides, initial_job_idx)


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
        from ghsweep.launch import followups

        with followups.overlapped():
            return super().launch(job_overrides, initial_job_idx)
