"""How the SLURM tasks of a run on several GPUs tell rank 0 how their workers ended.

srun starts one task per rank; each runs its own worker. Rank 0's task records the run, so it
waits, after its own worker ended, for every other rank's `rankN.json` (its status and error,
tagged with the SLURM job id so a report left by an earlier job is never taken for this one's).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ghsweep.core.atomic import write_atomic
from ghsweep.core.run_dir import RANK_REPORT
from ghsweep.core.run_result import RunStatus

# How long rank 0 waits, after its own worker ended, for the other ranks' tasks to say how theirs ended.
RANK_REPORT_WAIT_S = 300


def rank_report(run_dir: Path, rank: int) -> Path:
    return run_dir / RANK_REPORT.format(rank=rank)


def write_rank_report(run_dir: Path, rank: int, status: RunStatus, error: str | None) -> None:
    report = json.dumps({"job_id": own_task_job_id(), "status": status, "error": error})
    write_atomic(rank_report(run_dir, rank), report, mode=0o644)


def wait_for_ranks(run_dir: Path, world_size: int, wait_s: float = RANK_REPORT_WAIT_S) -> str | None:
    """Rank 0: wait for every other rank's report of this job; the first failure (or silence), else None."""
    job_id = own_task_job_id()
    deadline = time.monotonic() + wait_s
    for rank in range(1, world_size):
        path = rank_report(run_dir, rank)
        while (report := _read_report(path)).get("job_id") != job_id:
            if time.monotonic() > deadline:
                return f"rank {rank} did not report how its worker ended within {wait_s:g} s ({path.name})"
            time.sleep(1)
        if report["status"] != RunStatus.FINISHED:
            return f"rank {rank}: {report['error']}"
    return None


def _read_report(path: Path) -> dict:
    """A rank's report, {} while it is missing or half written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def own_task_job_id() -> str:
    """SLURM_JOB_ID, which every task of one job shares ('' outside SLURM); not requeue.slurm_job_id,
    which names a task of a job array as sacct does."""
    return os.environ.get("SLURM_JOB_ID", "")
