"""Hydra imports every module under hydra_plugins at each command's plugin scan (`--help` included):
ghsweep's launchers and sweeper import their libraries only when they are used."""

from __future__ import annotations

import json
import subprocess
import sys

# What ghsweep's plugins use only when they launch or sweep.
HEAVY = ["optuna", "mlflow", "torch", "submitit", "numpy"]

SCAN = f"""
import json, sys
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper

plugins = Plugins.instance()
found = [f"{{c.__module__}}.{{c.__name__}}" for c in plugins.discover(Launcher) + plugins.discover(Sweeper)]
print(json.dumps({{"found": found, "imported": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def test_the_plugin_scan_finds_ghsweeps_plugins_and_imports_no_heavy_library():
    proc = subprocess.run([sys.executable, "-c", SCAN], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    scan = json.loads(proc.stdout)
    assert {
        "hydra_plugins.ghsweep_launcher.ghsweep_launcher.BasicLauncher",
        "hydra_plugins.ghsweep_launcher.ghsweep_launcher.LocalLauncher",
        "hydra_plugins.ghsweep_launcher.ghsweep_launcher.SlurmLauncher",
        "hydra_plugins.ghsweep_sweeper.ghsweep_sweeper.TuneSweeper",
    } <= set(scan["found"])
    assert scan["imported"] == []
