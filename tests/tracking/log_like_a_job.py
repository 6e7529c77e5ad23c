"""One of many processes logging to one tracking server at once, through ghsweep's MlflowStore (the
code every sweep job logs with). Used by test_concurrent_jobs.py:

    python -m tests.tracking.log_like_a_job URI EXPERIMENT PARENT_RUN_ID JOB STEPS BARRIER_DIR JOBS
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ghsweep.core.names import JOB_NUM_TAG, ROLE_RUN
from ghsweep.tracking.mlflow_store import MlflowStore

BATCHES = 4  # the loss history goes in several requests, so the jobs' requests interleave


def value(job: int, step: int) -> float:
    return job * 1000.0 + step / 8


def main(uri: str, experiment: str, parent: str, job: int, steps: int, barrier: Path, jobs: int) -> None:
    store = MlflowStore(uri, experiment)
    run_id = store.start_run(f"job {job}", ROLE_RUN, {JOB_NUM_TAG: str(job)}, parent_run_id=parent)
    store.log_params(run_id, {f"param.{i}": str(job * i) for i in range(50)})
    # Everyone starts logging together: all processes are up and have their run before any logs.
    (barrier / f"ready-{job}").touch()
    while len(list(barrier.glob("ready-*"))) < jobs:
        time.sleep(0.05)
    points = [("loss", value(job, s), s) for s in range(steps)]
    size = -(-steps // BATCHES)
    for i in range(0, steps, size):
        store.log_metrics(run_id, points[i : i + size])
    store.log_metrics(run_id, [("tokens_per_s", 100.0 + job, 0), ("step_time_ms", 10.0 + job, 0)])
    store.set_tags(run_id, {"ghsweep.status": "FINISHED"})
    store.finish(run_id, "FINISHED")


if __name__ == "__main__":
    uri, experiment, parent, job, steps, barrier, jobs = sys.argv[1:]
    main(uri, experiment, parent, int(job), int(steps), Path(barrier), int(jobs))
