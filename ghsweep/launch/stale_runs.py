"""Runs left RUNNING in MLflow by a sweep process that is gone, and ending them with the reason.

A local sweep's parent run carries its process (`ghsweep.host`, `ghsweep.pid`, `ghsweep.pid_start`).
A sweep killed outright (`kill -9`, a lost login session) cannot end its runs; the next sweep into
the same experiment on the same host, or `python -m ghsweep.status SWEEP_DIR`, finds the process
gone and ends them FAILED; a run whose worker had finished (the sweep killed as it analysed the run's
profile) is recorded FINISHED from its run directory, with what the worker measured. Sweeps whose
jobs are SLURM or submitit jobs are left to `python -m ghsweep.status`, which asks the scheduler.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from ghsweep.core.names import HOST_TAG, PROFILE_ERROR_TAG, ROLE_SWEEP, SWEEP_DIR_TAG
from ghsweep.core.run_dir import METRICS, RESULT, SLURM_JOBS
from ghsweep.core.run_plan import RunPlan
from ghsweep.core.run_result import WORKER_PARTS, RunResult, RunStatus
from ghsweep.core.run_summary import RunSummary
from ghsweep.launch.job import loss_points
from ghsweep.launch.sweep_manifest import NOBODY, NOT_SAID_YET, live_holder
from ghsweep.launch.worker_process import process_start, stop_orphaned_worker
from ghsweep.tracking import records
from ghsweep.tracking.mlflow_store import MlflowStore
from ghsweep.train.system_metrics import system_points

log = logging.getLogger(__name__)

PID_TAG, PID_START_TAG, PID_NS_TAG = "ghsweep.pid", "ghsweep.pid_start", "ghsweep.pid_ns"


def _pid_namespace() -> str:
    """This process's PID namespace (`pid:[INODE]`): a pid means the same process only within one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_tags() -> dict[str, str]:
    """Tags that identify this process, for the parent run of a sweep it runs."""
    return {
        HOST_TAG: socket.gethostname(),
        PID_TAG: str(os.getpid()),
        PID_START_TAG: process_start(os.getpid()) or "",
        PID_NS_TAG: _pid_namespace(),
    }


def identity(tags: dict[str, str]) -> str:
    """The process the tags name, as its sweep directory's lock holds it (SweepManifest.claim)."""
    return f"pid {tags.get(PID_TAG)} on {tags.get(HOST_TAG)}, started at tick {tags.get(PID_START_TAG)}"


def process_identity() -> str:
    return identity(process_tags())


def process_died(tags: dict[str, str]) -> bool:
    """True when the sweep process the tags name ran on this host and is gone. Its sweep directory's lock
    says so where there is one (held by that process while it lives, whatever PID namespace it runs in);
    else its pid, looked up only from the PID namespace it ran in: a pid that cannot be seen from here
    is no dead process."""
    if tags.get(HOST_TAG) != socket.gethostname() or not tags.get(PID_TAG):
        return False
    holder = live_holder(Path(tags[SWEEP_DIR_TAG])) if tags.get(SWEEP_DIR_TAG) else None
    if holder is not None:  # held by another process: a sweep that resumes this one's directory
        return holder == NOBODY or holder not in (identity(tags), NOT_SAID_YET)
    if tags.get(PID_NS_TAG, _pid_namespace()) != _pid_namespace():
        return False
    started = process_start(int(tags[PID_TAG]))
    return started is None or started != tags.get(PID_START_TAG, started)


def died_reason(tags: dict[str, str]) -> str:
    return f"the sweep process died (pid {tags.get(PID_TAG)} on {tags.get(HOST_TAG)}) before this run ended"


def end_running_children(store: MlflowStore, parent_run_id: str, status: RunStatus, reason: str) -> int:
    """End every child run of the sweep still RUNNING in MLflow, and its result.json; returns how many."""
    children = store.search(parent_run_id=parent_run_id, status=RunStatus.RUNNING)
    for child in children:
        run_dir = Path(child.run_dir)
        if child.tags.get(HOST_TAG) == socket.gethostname() and stop_orphaned_worker(run_dir):
            log.warning("%s: stopped its worker, left running by the sweep process", child.name)
        ended = ended_on_disk(run_dir, child.run_id)
        if ended is not None:  # its record was being made: the run directory holds the whole of it
            record_ended_on_disk(store, ended)
            continue
        trained = trained_on_disk(run_dir, child.run_id)
        if trained is not None:  # stopped in its profile's analysis: what the worker measured stands
            record_ended_on_disk(store, trained, analysis_cut_short(run_dir, reason))
            trained.save()
            continue
        log.error("%s: %s: %s", child.name, status, reason)
        records.end_run(store, child.run_id, records.RunEnd(status, reason))
        if (run_dir / RESULT).is_file():
            result = RunResult.load(run_dir)
            if result.status == RunStatus.RUNNING:
                result.status, result.error = status, reason
                result.save()
    return len(children)


def ended_on_disk(run_dir: Path, run_id: str) -> RunResult | None:
    """The result of MLflow run `run_id` where its run directory says the run ended (result.json written
    by its record, before MLflow is told), else None."""
    try:
        result = RunResult.load(run_dir)
    except (OSError, ValueError, TypeError):
        return None
    return result if result.mlflow_run_id == run_id and result.status != RunStatus.RUNNING else None


def trained_on_disk(run_dir: Path, run_id: str) -> RunResult | None:
    """The result of MLflow run `run_id` whose worker finished (its summary.json written) while its
    result.json still says RUNNING (the sweep stopped as it analysed the run's profile or recorded it):
    FINISHED with what the worker measured; else None."""
    try:
        result, summary = RunResult.load(run_dir), RunSummary.load(run_dir)
    except (OSError, ValueError, TypeError):
        return None
    if result.mlflow_run_id != run_id or result.status != RunStatus.RUNNING:
        return None
    result.status, result.error, result.metrics = RunStatus.FINISHED, None, summary.metrics
    result.timing |= {k: summary.timing[k] for k in ("setup_s", "train_s", *WORKER_PARTS) if k in summary.timing}
    return result


def analysis_cut_short(run_dir: Path, reason: str) -> dict[str, str]:
    """The profile_error tag of a run whose profile was recorded and never analysed (`reason`: why)."""
    try:
        profiled = RunPlan.load(run_dir).profile.used not in ("none", "memory")
    except (OSError, ValueError, TypeError, KeyError):
        profiled = False
    if not profiled:
        return {}
    return {PROFILE_ERROR_TAG: f"not analysed: {reason}; python -m ghsweep.analyze {run_dir} analyses it"}


def record_ended_on_disk(store: MlflowStore, result: RunResult, tags: dict[str, str] | None = None) -> None:
    """A run that ended on disk while its MLflow run stayed RUNNING (the store away, or the sweep killed
    as it recorded): its end, metrics and files, recorded from its run directory."""
    run_dir = Path(result.run_dir)
    records.record_from_run_dir(store, result, loss_points(run_dir / METRICS), system_points(run_dir), tags)
    log.warning("%s: recorded %s in MLflow from its run directory", result.name, result.status)


def end_sweep_run(store: MlflowStore, parent_run_id: str, status: RunStatus, reason: str) -> None:
    end_running_children(store, parent_run_id, status, reason)
    records.finish_sweep_run(store, parent_run_id, status, reason)


def end_dead_sweeps(store: MlflowStore) -> None:
    """End, FAILED, the local sweeps of the store's experiment whose process died on this host."""
    for sweep in store.search(
        role=ROLE_SWEEP, status=RunStatus.RUNNING, tags={HOST_TAG: socket.gethostname()}, limit=1000
    ):
        tags = sweep.tags
        if process_died(tags) and not (Path(tags.get(SWEEP_DIR_TAG, "")) / SLURM_JOBS).exists():
            log.warning("MLflow: %s was left RUNNING: %s; ending it FAILED", sweep.name, died_reason(tags))
            end_sweep_run(store, sweep.run_id, RunStatus.FAILED, died_reason(tags))
