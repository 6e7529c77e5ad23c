"""Sweeps through the local_slurm launch profile, recorded on a real MLflow tracking server."""

from __future__ import annotations

import time

from ghsweep.tracking.mlflow_store import MlflowStore, StoredRun


def sweep_args(server, experiment: str, *args: str) -> list[str]:
    """The command line of a smoke sweep on SLURM that logs to `server` in `experiment`."""
    # The profile names its tracking server (tracking.server_uri); this session's server has its own port.
    return [
        "-m",
        "hydra/launcher=local_slurm",
        "experiment=smoke",
        "precision=fp32",
        f"tracking.server_uri={server.url}",
        f"tracking.experiment={experiment}",
        *args,
    ]


def runs(server, experiment: str, role: str) -> list[StoredRun]:
    return MlflowStore(server.url, experiment).search(role=role)


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
