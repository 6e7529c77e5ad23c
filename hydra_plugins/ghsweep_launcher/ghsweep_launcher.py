"""The launchers ghsweep's profiles name; Hydra instantiates launchers only from hydra_plugins.

Everything they add to hydra-submitit-launcher's is in ghsweep.launch.submitit_launcher.
"""

from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin

from ghsweep.launch.submitit_launcher import GhsweepLauncher


class LocalLauncher(GhsweepLauncher, plugin.LocalLauncher):
    pass


class SlurmLauncher(GhsweepLauncher, plugin.SlurmLauncher):
    pass
