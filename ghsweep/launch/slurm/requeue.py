"""A SLURM job that SLURM requeued (preempted, its node lost, `scontrol requeue`): the job starts
again from the top, in the same run directory, and continues the MLflow run its first start opened.

Benchmark runs are short, so a requeued run trains again from scratch. The attempt that was stopped
leaves its record to the start that follows it (or, for a job cancelled for good, to the sweep's
settling of its SLURM state, ghsweep.launch.slurm.submitted_jobs): it must not record a failure that is only
its job being stopped.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from pathlib import Path

from ghsweep.core.run_dir import RESULT
from ghsweep.core.run_result import RunResult, RunStatus

log = logging.getLogger(__name__)

# How long a job whose worker was killed from outside waits to see whether SLURM is ending the job.
ENDING_WAIT_S = 15.0


def restart_count() -> int:
    """How many times SLURM has requeued this job (0 outside SLURM, or on its first start)."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def slurm_job_id() -> str | None:
    """This job's id as sacct names it: ARRAY_TASK for a task of a job array."""
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def earlier_start(run_dir: Path) -> RunResult | None:
    """The record of this run's earlier start when SLURM requeued its job and that start did not
    finish; None on a first start."""
    if restart_count() == 0 or not (run_dir / RESULT).exists():
        return None
    earlier = RunResult.load(run_dir)
    return earlier if earlier.mlflow_run_id and earlier.status != RunStatus.FINISHED else None


def requeue_reason() -> str:
    """Why this job started again, from SLURM's accounting of its earlier starts (PREEMPTED,
    NODE_FAIL, REQUEUED by hand)."""
    job_id = slurm_job_id()
    restart = restart_count()
    try:
        out = subprocess.run(
            ["sacct", "-j", str(job_id), "--duplicates", "-X", "-n", "-P", "-o", "State"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    # The earlier starts' states, oldest first; this start's own (RUNNING) is the last line.
    states = [line.split()[0] for line in out.splitlines() if line.strip()][:-1]
    after = f" after {states[-1]}" if states else ""
    return f"SLURM job {job_id} was requeued{after} (restart {restart})"


def controller_state(job_id: str) -> str | None:
    """The job's state as the SLURM controller holds it now (None once it no longer knows the job).
    Unlike sacct's, it is never behind: a job requeued after its node was lost is PENDING here while
    accounting may still show its earlier start's NODE_FAIL as the job's latest record."""
    try:
        out = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    state = re.search(r"\bJobState=(\S+)", out)
    return state.group(1) if state else None


def job_ending() -> str | None:
    """In a SLURM job whose worker was just killed from outside: SLURM's state for the job when the
    controller is ending it (cancelled, requeued, preempted, its node lost), else None."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    deadline = time.monotonic() + ENDING_WAIT_S
    while True:
        state = controller_state(job_id)
        if state and state != "RUNNING":
            return state
        if time.monotonic() > deadline:
            return None
        time.sleep(1.0)


def wait_to_be_stopped(timeout_s: float = 300.0) -> None:
    """Wait for SLURM to stop this job (it is ending it), rather than return: a job that returned
    leaves submitit a result, which would pass for its requeued start's."""
    time.sleep(timeout_s)
