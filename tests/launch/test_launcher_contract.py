"""Hydra's own launcher contract (hydra.test_utils.launcher_common_tests) on the launcher of
hydra/launcher=local (`ghsweep_basic`: Hydra's basic launcher taking ghsweep's `retries` key), with
Hydra's test apps: sweeps of one and two jobs, overrides, strict configs, custom resolvers, and real
`-m` runs of generated apps in a subprocess.

ghsweep's submitit launchers (`submitit_local`, the SLURM profiles) are not run on these apps: their
launch() plans each combination from ghsweep's own config (its world, run hash and MLflow store), which
Hydra's test apps do not have; tests/launch/test_submitit_local.py and test_slurm.py run them on
ghsweep's app.
"""

from __future__ import annotations

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.version import VersionBase
from packaging.version import Version

LAUNCHERS = "hydra_plugins.ghsweep_launcher.ghsweep_launcher"


@pytest.fixture(autouse=True)
def hydra_s_compatibility_version_base():
    """Hydra's contract is written for its compatibility defaults (version_base 1.1: a job changes into
    its output folder and logs there). The version base is a process-wide singleton that a test run
    earlier in this process may have set to ghsweep's 1.3."""
    base = VersionBase.instance()
    before = base.getbase()
    base.setbase(Version("1.1"))
    yield
    base.version_base = before


def test_hydra_s_plugin_scan_finds_ghsweep_s_launchers():
    found = {(c.__module__, c.__name__) for c in Plugins.instance().discover(Launcher)}
    assert {(LAUNCHERS, name) for name in ("BasicLauncher", "LocalLauncher", "SlurmLauncher")} <= found


@pytest.mark.parametrize("launcher_name, overrides", [("ghsweep_basic", ["hydra.launcher.retries=1"])])
class TestGhsweepBasicLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [({}, ["-m", "hydra/launcher=ghsweep_basic", "hydra/hydra_logging=disabled", "hydra/job_logging=disabled"])],
)
@pytest.mark.cli  # Hydra's integration suite runs each app as a process
class TestGhsweepBasicLauncherIntegration(IntegrationTestSuite):
    pass
