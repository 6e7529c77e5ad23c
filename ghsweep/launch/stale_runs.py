"""Runs left RUNNING in MLflow by a sweep process that is gone, and ending them with the reason.

A local sweep's parent run carries its process (`ghsweep.host`, `ghsweep.pid`, `ghsweep.pid_start`).
A sweep killed outright (`kill -9`, a lost login session) cannot end its runs; the next sweep into
the same experiment on the same host, or `python -m ghsweep.status SWEEP_DIR`, finds the process
gone and ends them FAILED. Sweeps whose jobs are SLURM or submitit jobs are left to
`python -m ghsweep.status`, which asks the scheduler.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from ghsweep.core.names import ERROR_TAG, HOST_TAG, ROLE_SWEEP, SWEEP_DIR_TAG
from ghsweep.core.run_dir import RESULT, SLURM_JOBS
from ghsweep.core.run_result import RunResult, RunStatus
from ghsweep.launch.worker_process import stop_orphaned_worker
from ghsweep.tracking.mlflow_store import MlflowStore

log = logging.getLogger(__name__)

PID_TAG, PID_START_TAG = "ghsweep.pid", "ghsweep.pid_start"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc), which tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def process_tags() -> dict[str, str]:
    """Tags that identify this process, for the parent run of a sweep it runs."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid()), PID_START_TAG: _start_time(os.getpid()) or ""}


def process_died(tags: dict[str, str]) -> bool:
    """True when the process the tags name ran on this host and is gone (its pid unused or reused)."""
    if tags.get(HOST_TAG) != socket.gethostname() or not tags.get(PID_TAG):
        return False
    started = _start_time(int(tags[PID_TAG]))
    return started is None or started != tags.get(PID_START_TAG, started)


def died_reason(tags: dict[str, str]) -> str:
    return f"the sweep process died (pid {tags.get(PID_TAG)} on {tags.get(HOST_TAG)}) before this run ended"


def end_running_children(store: MlflowStore, parent_run_id: str, status: RunStatus, reason: str) -> int:
    """End every child run of the sweep still RUNNING in MLflow, and its result.json; returns how many."""
    children = store.search(parent_run_id=parent_run_id, status=RunStatus.RUNNING)
    for child in children:
        log.error("%s: %s: %s", child.name, status, reason)
        store.end_run(child.run_id, status, reason)
        run_dir = Path(child.run_dir)
        if child.tags.get(HOST_TAG) == socket.gethostname() and stop_orphaned_worker(run_dir):
            log.warning("%s: stopped its worker, left running by the sweep process", child.name)
        if (run_dir / RESULT).is_file():
            result = RunResult.load(run_dir)
            if result.status == RunStatus.RUNNING:
                result.status, result.error = status, reason
                result.save()
    return len(children)


def end_sweep_run(store: MlflowStore, parent_run_id: str, status: RunStatus, reason: str) -> None:
    end_running_children(store, parent_run_id, status, reason)
    store.set_tags(parent_run_id, {ERROR_TAG: reason})
    store.finish(parent_run_id, status)


def settle_dead_sweeps(store: MlflowStore) -> None:
    """End, FAILED, the local sweeps of the store's experiment whose process died on this host."""
    for sweep in store.search(
        role=ROLE_SWEEP, status=RunStatus.RUNNING, tags={HOST_TAG: socket.gethostname()}, limit=1000
    ):
        tags = sweep.tags
        if process_died(tags) and not (Path(tags.get(SWEEP_DIR_TAG, "")) / SLURM_JOBS).exists():
            log.warning("MLflow: %s was left RUNNING: %s; ending it FAILED", sweep.name, died_reason(tags))
            end_sweep_run(store, sweep.run_id, RunStatus.FAILED, died_reason(tags))
