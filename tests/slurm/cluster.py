"""The single-node SLURM cluster of start_cluster.sh as a pytest fixture.

A cluster that already answers is used as it is. Otherwise the fixture starts one (root and
Debian's slurm packages needed) and stops it, by its recorded pids, when the session ends. Where it
cannot start, the tests skip with the reason, unless CI=true, where they fail (tests/optional_env.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.optional_env import unavailable

HERE = Path(__file__).resolve().parent
STATE_DIR = Path(os.environ.get("GHSWEEP_SLURM_STATE", "/var/tmp/ghsweep-slurm"))


def cluster_is_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=30)
    return out.returncode == 0 and any(s.rstrip("*") in ("idle", "mix", "alloc") for s in out.stdout.split())


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    """SLURM accounting's final state of each job (array tasks as 12_3)."""
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    states = dict(line.split("|", 1) for line in out.splitlines() if line)
    return {j: states.get(j, "missing") for j in job_ids}


@pytest.fixture(scope="session")
def slurm_cluster():
    if cluster_is_up():
        yield STATE_DIR
        return
    missing = [b for b in ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd") if shutil.which(b) is None]
    reason = None
    if missing:
        reason = (
            f"no SLURM cluster: {', '.join(missing)} not installed (apt-get install slurmctld slurmd "
            "slurm-client munge slurmdbd mariadb-server)"
        )
    elif os.geteuid() != 0:
        reason = f"no SLURM cluster: starting one needs root (sudo {HERE / 'start_cluster.sh'})"
    if reason:
        unavailable(reason)
    subprocess.run([str(HERE / "start_cluster.sh"), str(STATE_DIR)], check=True, timeout=300)
    yield STATE_DIR
    subprocess.run([str(HERE / "stop_cluster.sh"), str(STATE_DIR)], check=False, timeout=120)
