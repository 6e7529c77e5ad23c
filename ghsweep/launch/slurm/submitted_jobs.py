"""The jobs a sweep submitted through submitit, and what each one ended with.

The launcher writes one record per job into the sweep directory, so the end of a sweep can be
collected by the submitting process (wait=true) or later by `python -m ghsweep.status` (wait=false).
`collect_results` makes MLflow honest about jobs that ended outside ghsweep's control: cancelled, killed at
the time limit, lost with their node. Their child run ends FAILED or KILLED with the reason and the
SLURM log attached.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import submitit
from hydra.core.utils import JobStatus
from submitit.core.utils import FailedJobError, UncompletedJobError

from ghsweep.core.atomic import write_atomic
from ghsweep.core.errors import JobTimeout
from ghsweep.core.failures import failure_class
from ghsweep.core.run_dir import RESULT, SLURM_JOBS, WORKER_LOG
from ghsweep.core.run_result import RunResult, RunStatus
from ghsweep.launch.slurm.requeue import controller_state
from ghsweep.launch.sweep_manifest import SweepManifest
from ghsweep.tracking import records
from ghsweep.tracking.mlflow_store import MlflowStore

log = logging.getLogger(__name__)

# How often, at most, a job that returned while SLURM still says it runs is asked about (a forced
# sacct call): first after one poll, then ever more rarely up to this.
FORCED_STATE_S = 15.0
# SLURM states of a job that has not ended (UNKNOWN is not one: sacct may be unavailable for good).
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")
# States sacct gives a start of a job that SLURM may have requeued: the job itself may not have ended.
REQUEUED_AFTER = ("NODE_FAIL", "PREEMPTED", "BOOT_FAIL")


def slurm_unavailable(launcher: str) -> str | None:
    """Why a SLURM sweep cannot be submitted from here (one line), or None: SLURM's commands are not
    installed, or its controller does not answer. Asked before the sweep records anything."""
    missing = [c for c in ("sbatch", "srun", "scontrol") if shutil.which(c) is None]
    preview = f"`python -m ghsweep -m hydra/launcher={launcher} ... dry_run=true` previews the sweep anywhere"
    if missing:
        return (
            f"hydra/launcher={launcher} submits to SLURM, and its commands are not on PATH here "
            f"({', '.join(missing)}); submit from a machine of the cluster. {preview}"
        )
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return f"hydra/launcher={launcher}: the SLURM controller did not answer `scontrol ping` in 60 s. {preview}"
    if ping.returncode != 0:
        # Its first line says which controller is down, or why scontrol found none (its config).
        said = [line for line in (ping.stdout + ping.stderr).splitlines() if line.strip(" *")]
        return (
            f"hydra/launcher={launcher}: the SLURM controller does not answer (`scontrol ping`: "
            f"{said[0].strip() if said else f'exit status {ping.returncode}'}). {preview}"
        )
    return None


@dataclass(frozen=True)
class SubmittedJob:
    job_id: str
    num: int
    name: str
    run_dir: str
    overrides: list[str]
    run_hash: str
    folder: str
    stdout: str
    stderr: str

    def submitit_job(self) -> submitit.Job:
        """A handle on the SLURM job from any process: state through sacct, result from its pickle."""
        return submitit.SlurmJob(folder=self.folder, job_id=self.job_id)


def save_jobs(sweep_dir: Path, jobs: list[SubmittedJob]) -> None:
    # Whole or not at all: `ghsweep.status` and a resumed sweep read it while a sweep submits.
    known = load_jobs(sweep_dir)
    write_atomic(sweep_dir / SLURM_JOBS, json.dumps([asdict(j) for j in known + jobs], indent=2), mode=0o644)


def load_jobs(sweep_dir: Path) -> list[SubmittedJob]:
    path = sweep_dir / SLURM_JOBS
    return [SubmittedJob(**j) for j in json.loads(path.read_text())] if path.exists() else []


def has_ended(job: submitit.Job) -> bool:
    """Its task is over and SLURM says so too: a cancelled job can write its result while SLURM still
    reports it RUNNING, and only the final state says it was cancelled."""
    if not job.done() or job.state.startswith(ACTIVE_STATES):
        return False
    if requeued(job.state, job.job_id):
        # submitit stops asking about a job it saw end: forget its states so they are asked again.
        job.watcher.clear()
        return False
    return True


def requeued(state: str, job_id: str) -> bool:
    """Whether a job that sacct says ended `state` was requeued by the controller: for a moment after
    a node is lost, sacct's latest record of the job is the lost start's NODE_FAIL while the
    controller already holds the job PENDING again."""
    return state.startswith(REQUEUED_AFTER) and (controller_state(job_id) or "").startswith(ACTIVE_STATES)


def wait_until_ended(jobs: list[submitit.Job], poll_s: float) -> None:
    last_forced = time.monotonic()
    forced_every_s = poll_s
    seen_waiting: set[str] = set()
    while not all(has_ended(j) for j in jobs):
        # submitit asks sacct ever more rarely the longer its jobs run (up to every 10 minutes): a job
        # whose task has returned but whose state is still active (its end not yet seen, or a requeued
        # job running again) is asked about after a poll, then twice as long after each ask up to
        # FORCED_STATE_S; SLURM usually says it ended within seconds, and the sweep ends then.
        waiting = [j for j in jobs if j.done() and not has_ended(j)]
        if {j.job_id for j in waiting} - seen_waiting:
            seen_waiting.update(j.job_id for j in waiting)
            forced_every_s = poll_s
        if waiting and time.monotonic() - last_forced >= forced_every_s:
            waiting[0].get_info(mode="force")  # one sacct call updates every job of the watcher
            last_forced = time.monotonic()
            forced_every_s = min(2 * forced_every_s, FORCED_STATE_S)
        time.sleep(poll_s)


def job_failure(job: submitit.Job) -> tuple[RunStatus, str] | None:
    """(MLflow status, reason) of a finished job that did not complete its task, else None."""
    # The state first: a cancelled job may still have had time to return, with its worker killed.
    state = job.state
    if state.startswith("CANCELLED"):
        return RunStatus.KILLED, f"SLURM job {job.job_id} was cancelled from outside ({state})"
    if state == "TIMEOUT":
        return RunStatus.FAILED, f"SLURM job {job.job_id} was killed at its time limit (TIMEOUT) and not requeued"
    try:
        # A job of several tasks (one per rank) returns one result per task; rank 0's records the run.
        returned = job.results()[0]
    # FailedJobError (the task raised) subclasses UncompletedJobError, so it is caught first.
    except FailedJobError as exc:
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        return RunStatus.FAILED, f"SLURM job {job.job_id} failed: {lines[-1] if lines else state}"
    except UncompletedJobError as exc:
        return RunStatus.FAILED, f"SLURM job {job.job_id} ended {state}: {str(exc).strip().splitlines()[0]}"
    if returned.status == JobStatus.FAILED:
        # The task raised (Hydra's run_job keeps the exception): ghsweep could not record the run itself.
        raised = returned._return_value
        if isinstance(raised, JobTimeout):  # the time limit came before the run could record itself
            return RunStatus.FAILED, str(raised)
        return RunStatus.FAILED, f"SLURM job {job.job_id}: {type(raised).__name__}: {raised}"
    return None


def returned_result(job: submitit.Job) -> RunResult | None:
    """The result a job that completed its task returned, where its run directory holds none (Hydra could
    not start it there: launch.job.start_job recorded it); None where it returned none."""
    value = job.results()[0]._return_value
    return RunResult(**{**value, "status": RunStatus(value["status"])}) if isinstance(value, dict) else None


def collect_results(sweep_dir: Path, jobs: list[tuple[SubmittedJob, submitit.Job]]) -> list[RunResult]:
    """The result of every finished job, recording in MLflow those that could not record themselves."""
    manifest = SweepManifest.require(sweep_dir)
    store = MlflowStore(manifest.tracking_uri, manifest.experiment)
    results: list[RunResult] = []
    for submitted, job in jobs:
        run_dir = Path(submitted.run_dir)
        # Not read through a run directory that is a link: its job refused it (launch.job.start_job).
        own_file = (run_dir / RESULT).exists() and not run_dir.is_symlink()
        failure = job_failure(job)
        result = RunResult.load(run_dir) if own_file else None if failure else returned_result(job)
        if failure and (result is None or result.status != RunStatus.FINISHED):
            result = _record_lost(store, manifest, submitted, result, *failure)
        if result is None:
            raise FileNotFoundError(
                f"{run_dir / RESULT}: SLURM job {submitted.job_id} completed its task but its run recorded no result"
            )
        if result.status != RunStatus.FINISHED and result.mlflow_run_id is not None:
            records.record_slurm_logs(store, result.mlflow_run_id, Path(submitted.stdout), Path(submitted.stderr))
        results.append(result)
    return results


def _record_lost(
    store: MlflowStore,
    manifest: SweepManifest,
    submitted: SubmittedJob,
    result: RunResult | None,
    status: RunStatus,
    reason: str,
) -> RunResult:
    """End the child run of a job that died (creating it if the job never started) and say why.

    SLURM's account wins over what the job may have recorded while it was being stopped (a worker
    killed by SIGTERM is what a cancelled job looks like from inside); that stays in the reason.
    A job collected before (`python -m ghsweep.status` run again) is left as it was recorded.
    """
    if result is not None and result.status == status and (result.error or "").startswith(reason):
        return result
    log.error("%s: %s: %s", submitted.name, status, reason)
    run_dir = Path(submitted.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = result.mlflow_run_id if result is not None else None
    if result is None or run_id is None:
        run = records.ChildRun(
            submitted.name,
            str(run_dir),
            submitted.overrides,
            submitted.num,
            submitted.run_hash,
            manifest.parent_run_id,
        )
        run_id = records.start_child_run(store, run)
        result = RunResult(
            name=submitted.name,
            run_dir=str(run_dir),
            overrides=submitted.overrides,
            status=status,
            mlflow_run_id=run_id,
        )
    if result.error and result.status != RunStatus.RUNNING:
        reason = f"{reason}; the job recorded: {result.error}"
    result.status, result.error = status, reason
    # A job cancelled from outside has no class: nothing failed, someone stopped it.
    result.failure_class = failure_class(reason) if status == RunStatus.FAILED else None
    end = records.RunEnd(status, reason, result.failure_class, submitted.job_id, [run_dir / WORKER_LOG])
    records.end_run(store, run_id, end)
    result.save()
    return result
