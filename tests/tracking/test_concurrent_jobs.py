"""Many jobs logging to one real tracking server at the same moment lose no run and no metric point.

The README's load figure comes from this test (its printed line)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ghsweep.core.names import ROLE_SWEEP
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.support.paths import REPO
from tests.tracking.log_like_a_job import value

JOBS = int(os.environ.get("GHSWEEP_LOAD_JOBS", "48"))
STEPS = 500


def test_concurrent_jobs_lose_nothing(mlflow_server, tmp_path):
    store = MlflowStore(mlflow_server.url, "concurrent_jobs")
    # As a sweep does: the experiment and the parent exist before any job starts.
    parent = store.start_run("sweep concurrent", ROLE_SWEEP, {})
    env = dict(os.environ, PYTHONPATH=str(REPO))
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.tracking.log_like_a_job",
                mlflow_server.url,
                "concurrent_jobs",
                parent,
                str(job),
                str(STEPS),
                str(tmp_path),
                str(JOBS),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for job in range(JOBS)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    retries = sum(o.count("tracking server busy") for o in outputs)
    print(
        f"{JOBS} jobs x {STEPS} loss points: {time.monotonic() - started:.1f} s wall, including start-up; "
        f"{retries} busy-server retries"
    )
    assert [p.returncode for p in procs] == [0] * JOBS, "\n".join(o[-1500:] for o in outputs if o)

    children = store.search(parent_run_id=parent)
    assert len(children) == JOBS
    by_job = {c.job_num: c for c in children}
    assert sorted(by_job) == list(range(JOBS))
    points = 0
    for job, run in by_job.items():
        assert run.status == "FINISHED"
        assert run.metrics["tokens_per_s"] == 100.0 + job
        assert len(run.params) == 50 and run.params["param.7"] == str(job * 7)
        history = store.metric_history(run.run_id, "loss")
        assert history == [(s, value(job, s)) for s in range(STEPS)]
        points += len(history)
    assert points == JOBS * STEPS
