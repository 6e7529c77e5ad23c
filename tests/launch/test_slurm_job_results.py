"""What `collect_results` records in MLflow for SLURM jobs that finished, failed, timed out or were cancelled:
a real SQLite MLflow store and real run directories; only the SLURM job is a stand-in (the few
attributes submitted_jobs reads of a submitit job), so these run in seconds instead of on a cluster."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from submitit.core.utils import FailedJobError, UncompletedJobError

from ghsweep.core.errors import JobTimeout
from ghsweep.core.names import ERROR_TAG, FAILURE_CLASS_TAG, JOB_NUM_TAG, ROLE_RUN, ROLE_SWEEP, RUN_HASH_TAG, STATUS_TAG
from ghsweep.core.run_result import RunResult
from ghsweep.launch.slurm.submitted_jobs import FORCED_STATE_S, SubmittedJob, collect_results, wait_until_ended
from ghsweep.launch.sweep_manifest import SweepManifest
from ghsweep.tracking.mlflow_store import MlflowStore, StoredRun

EXPERIMENT = "settle_test"


@dataclasses.dataclass
class FakeSlurmJob:
    """What submitted_jobs reads of a submitit.Job: its id, SLURM's state, and the task's results."""

    job_id: str
    state: str
    returned: JobReturn | Exception | None = None

    def done(self) -> bool:
        return True

    def results(self) -> list[JobReturn]:
        if isinstance(self.returned, Exception):
            raise self.returned
        return [self.returned]


@pytest.fixture()
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, MlflowStore, str]:
    monkeypatch.chdir(tmp_path)  # the SQLite store keeps its artifacts under ./mlruns
    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}", EXPERIMENT)
    parent = store.start_run("sweep settle", ROLE_SWEEP, {})
    sweep_dir = tmp_path / "multirun"
    SweepManifest(store.tracking_uri, EXPERIMENT, parent, "python -m ghsweep -m ...").save(sweep_dir)
    return sweep_dir, store, parent


def submitted(sweep_dir: Path, num: int) -> SubmittedJob:
    logs = sweep_dir / ".submitit" / str(num)
    logs.mkdir(parents=True)
    (logs / "out").write_text(f"job {num} stdout\n")
    (logs / "err").write_text(f"job {num} stderr\n")
    return SubmittedJob(
        job_id=str(100 + num),
        num=num,
        name=f"precision=bf16,n={num}",
        run_dir=str(sweep_dir / str(num)),
        overrides=["precision=bf16", f"n={num}"],
        run_hash=f"hash{num}",
        folder=str(logs),
        stdout=str(logs / "out"),
        stderr=str(logs / "err"),
    )


def recorded_by_job(store: MlflowStore, parent: str, job: SubmittedJob, status: str, error: str | None = None) -> str:
    """What a job that started writes before SLURM stops it: its child run and result.json."""
    run_id = store.start_run(job.name, ROLE_RUN, {JOB_NUM_TAG: str(job.num)}, parent_run_id=parent)
    Path(job.run_dir).mkdir(parents=True)
    RunResult(job.name, job.run_dir, job.overrides, status, error=error, mlflow_run_id=run_id).save()
    return run_id


def only_child(store: MlflowStore, parent: str) -> StoredRun:
    children = store.search(parent_run_id=parent)
    assert len(children) == 1, [c.name for c in children]
    return children[0]


def test_a_finished_job_keeps_its_own_record(sweep):
    sweep_dir, store, parent = sweep
    job = submitted(sweep_dir, 0)
    run_id = recorded_by_job(store, parent, job, "FINISHED")
    store.finish(run_id, "FINISHED")
    [result] = collect_results(
        sweep_dir, [(job, FakeSlurmJob(job.job_id, "COMPLETED", JobReturn(status=JobStatus.COMPLETED)))]
    )
    assert (result.status, result.error, result.mlflow_run_id) == ("FINISHED", None, run_id)
    child = only_child(store, parent)
    assert child.status == "FINISHED" and ERROR_TAG not in child.tags
    assert store.artifact_paths(run_id) == set()


def test_a_job_cancelled_before_it_started_gets_a_killed_run_with_the_slurm_logs(sweep):
    sweep_dir, store, parent = sweep
    job = submitted(sweep_dir, 1)
    [result] = collect_results(sweep_dir, [(job, FakeSlurmJob(job.job_id, "CANCELLED by 1000"))])
    reason = "SLURM job 101 was cancelled from outside (CANCELLED by 1000)"
    assert (result.status, result.error) == ("KILLED", reason)
    assert RunResult.load(Path(job.run_dir)) == result
    child = only_child(store, parent)
    assert child.run_id == result.mlflow_run_id and child.name == job.name
    assert (child.status, child.role, child.error, child.tags[STATUS_TAG]) == ("KILLED", ROLE_RUN, reason, "KILLED")
    assert FAILURE_CLASS_TAG not in child.tags  # stopped by someone: no failure to classify
    assert (child.job_num, child.overrides, child.run_dir) == (1, job.overrides, job.run_dir)
    assert child.tags[RUN_HASH_TAG] == "hash1" and child.tags["ghsweep.slurm_job_id"] == "101"
    assert store.artifact_paths(child.run_id, "slurm") == {"slurm/out", "slurm/err"}
    assert store.artifact_text(child.run_id, "slurm/err") == "job 1 stderr\n"


def test_a_job_killed_at_its_time_limit_ends_its_own_run_failed_with_what_it_recorded(sweep):
    sweep_dir, store, parent = sweep
    job = submitted(sweep_dir, 2)
    run_id = recorded_by_job(store, parent, job, "FAILED", error="worker stopped by SIGTERM")
    [result] = collect_results(sweep_dir, [(job, FakeSlurmJob(job.job_id, "TIMEOUT"))])
    reason = (
        "SLURM job 102 was killed at its time limit (TIMEOUT) and not requeued; "
        "the job recorded: worker stopped by SIGTERM"
    )
    assert (result.status, result.error, result.mlflow_run_id) == ("FAILED", reason, run_id)
    child = only_child(store, parent)
    assert (child.run_id, child.status, child.error) == (run_id, "FAILED", reason)


@pytest.mark.parametrize(
    ("returned", "reason"),
    [
        # FailedJobError subclasses UncompletedJobError: the reason is the error, not the trace's header.
        (
            FailedJobError("Job (task=0) failed during processing with trace:\n...\nMemoryError: node out of memory\n"),
            "SLURM job 103 failed: MemoryError: node out of memory",
        ),
        (
            UncompletedJobError("Job 103 (task: 0) with path x\nhas not produced any output (state: NODE_FAIL)"),
            "SLURM job 103 ended NODE_FAIL: Job 103 (task: 0) with path x",
        ),
        (
            JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("cannot open the tracking store")),
            "SLURM job 103: RuntimeError: cannot open the tracking store",
        ),
        (
            JobReturn(status=JobStatus.FAILED, _return_value=JobTimeout("the time limit came while recording")),
            "the time limit came while recording",
        ),
    ],
    ids=["task-raised", "node-lost", "job-raised", "job-timeout"],
)
def test_a_failed_job_that_recorded_nothing_gets_a_failed_run_saying_why(sweep, returned, reason):
    sweep_dir, store, parent = sweep
    job = submitted(sweep_dir, 3)
    state = "NODE_FAIL" if isinstance(returned, UncompletedJobError) else "FAILED"
    [result] = collect_results(sweep_dir, [(job, FakeSlurmJob(job.job_id, state, returned))])
    assert (result.status, result.error) == ("FAILED", reason)
    child = only_child(store, parent)
    assert (child.status, child.error) == ("FAILED", reason)
    # A job lost with its node is the cluster's failure; the others are the combination's.
    failure_class = "infrastructure" if "NODE_FAIL" in reason else "deterministic"
    assert result.failure_class == child.tags[FAILURE_CLASS_TAG] == failure_class
    assert store.artifact_paths(child.run_id, "slurm") == {"slurm/out", "slurm/err"}


def test_settling_again_leaves_the_record_as_it_was(sweep):
    sweep_dir, store, parent = sweep
    job = submitted(sweep_dir, 4)
    slurm_job = FakeSlurmJob(job.job_id, "CANCELLED")
    [first] = collect_results(sweep_dir, [(job, slurm_job)])
    [second] = collect_results(sweep_dir, [(job, slurm_job)])
    assert second == first
    assert only_child(store, parent).run_id == first.mlflow_run_id


class JobEndingLate:
    """A job whose task has returned while SLURM says RUNNING for `ends_after_s` more: its state is
    only asked anew by a forced sacct call (get_info), as submitit's watcher then has it cached."""

    def __init__(self, ends_after_s: float) -> None:
        self.job_id = "200"
        self.ends_at = time.monotonic() + ends_after_s
        self.state = "RUNNING"
        self.forced = 0

    def done(self) -> bool:
        return True

    def get_info(self, mode: str) -> None:
        assert mode == "force"
        self.forced += 1
        if time.monotonic() >= self.ends_at:
            self.state = "COMPLETED"


def test_a_returned_job_is_seen_ended_within_polls_of_slurm_saying_so_and_sacct_is_not_asked_each_poll():
    job = JobEndingLate(ends_after_s=1.0)
    started = time.monotonic()
    wait_until_ended([job], poll_s=0.05)  # type: ignore[list-item]  # what submitted_jobs reads of a job
    # Asked 0.05, 0.1, 0.2, 0.4, 0.8 s after the ask before: seen ended at about 1.55 s, not FORCED_STATE_S late.
    assert time.monotonic() - started < 1.0 + FORCED_STATE_S / 3
    assert 3 <= job.forced <= 7  # 20 polls a second, sacct asked ever more rarely
