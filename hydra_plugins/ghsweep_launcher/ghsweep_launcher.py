"""The launchers ghsweep's profiles name; Hydra instantiates launchers only from hydra_plugins.

Everything they add to hydra-submitit-launcher's is in ghsweep.launch.submitit_launcher.
"""

from hydra._internal.core_plugins import basic_launcher
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin

from ghsweep.launch.submitit_launcher import GhsweepLauncher


class LocalLauncher(GhsweepLauncher, plugin.LocalLauncher):
    pass


class SlurmLauncher(GhsweepLauncher, plugin.SlurmLauncher):
    pass


class BasicLauncher(basic_launcher.BasicLauncher):
    """Hydra's basic launcher (one combination after another, in this process) taking ghsweep's
    `retries` key, which each job reads (ghsweep.launch.job)."""

    def __init__(self, retries: int = 0) -> None:
        super().__init__()
