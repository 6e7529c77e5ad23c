"""The config schemas of ghsweep's launchers: the launchers' own keys (Hydra's basic launcher's,
hydra-submitit-launcher's) plus `retries`, which each job reads (ghsweep.launch.job). Launch
profiles in launchers/ build on them (`/hydra/launcher/ghsweep_slurm@hydra.launcher`).

`retries` is typed Any so that a bad value reaches ghsweep's own one-line refusal
(ghsweep.config.validate.launcher_retries) rather than a schema error.
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

LAUNCHERS = "hydra_plugins.ghsweep_launcher.ghsweep_launcher"


@dataclass
class BasicConf:
    _target_: str = f"{LAUNCHERS}.BasicLauncher"
    retries: Any = 0


@dataclass
class SlurmConf(SlurmQueueConf):
    _target_: str = f"{LAUNCHERS}.SlurmLauncher"
    # On a cluster nodes fail and jobs are preempted: one more try by default.
    retries: Any = 1


ConfigStore.instance().store(group="hydra/launcher", name="ghsweep_basic", node=BasicConf, provider="ghsweep")
ConfigStore.instance().store(group="hydra/launcher", name="ghsweep_slurm", node=SlurmConf, provider="ghsweep")
