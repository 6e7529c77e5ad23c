"""The two-node SLURM cluster of start_cluster.sh, started for a test session (the fixture `slurm_cluster`).

Each session starts its own cluster (root and Debian's slurm packages needed): its config, state and
daemons' ports are the session's (a temporary directory, free ports), and its SLURM_CONF is set for
the session, so two test runs on one host do not share daemons. It is stopped, by its recorded pids,
when the session ends. With SLURM_CONF set beforehand, the cluster it names is used as it is when it
answers. Where none can start, the tests skip with the reason, unless CI=true, where they fail
(tests/optional_env.py).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.optional_env import unavailable

HERE = Path(__file__).resolve().parent
# The daemons' four ports (start_cluster.sh's PORT_BASE to PORT_BASE+3) are drawn from here.
PORT_RANGE = (20000, 60000)


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


def free_port_base(count: int = 4) -> int:
    """The first of `count` consecutive ports that nothing on this host listens on now."""
    rng = random.Random(os.getpid())
    for _ in range(200):
        base = rng.randrange(*PORT_RANGE)
        try:
            with ExitStack() as held:
                for port in range(base, base + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports in {PORT_RANGE}")


@contextmanager
def running_cluster() -> Iterator[Path]:
    """The cluster SLURM_CONF names when it answers, else one started for as long as this is open
    (its state directory); the tests' session fixture `slurm_cluster` (tests/launch/conftest.py)."""
    if os.environ.get("SLURM_CONF") and cluster_is_up():
        yield Path(os.environ["SLURM_CONF"]).parent
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
    with started_cluster() as state:
        yield state


@contextmanager
def started_cluster() -> Iterator[Path]:
    """A cluster of its own, started for as long as this is open (its state directory); SLURM_CONF
    names it meanwhile."""
    # Not under pytest's own temporary folder: that is readable by its owner only, and munged runs as
    # the munge user, who must reach its log and key there.
    state = Path(tempfile.mkdtemp(prefix="ghsweep-slurm-", dir="/var/tmp"))
    state.chmod(0o755)
    before = os.environ.get("SLURM_CONF")
    # For this process and every command it starts (sbatch through submitit, the CLI under test).
    os.environ["SLURM_CONF"] = str(state / "etc" / "slurm.conf")
    try:
        subprocess.run([str(HERE / "start_cluster.sh"), str(state), str(free_port_base())], check=True, timeout=300)
        yield state
    finally:
        subprocess.run([str(HERE / "stop_cluster.sh"), str(state)], check=False, timeout=120)
        shutil.rmtree(state, ignore_errors=True)
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
