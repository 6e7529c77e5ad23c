"""A SLURM job stopped from outside and requeued starts its run over and finishes it, on the real
two-node cluster: `scontrol requeue` on a running job, a node taken down under it and a preemption
notice (`scancel --signal=USR2`). Each time the run ends FINISHED in the same MLflow run, its
earlier attempt recorded, nothing duplicated."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ghsweep.core.run_dir import METRICS, SLURM_JOBS
from ghsweep.launch.slurm.requeue import controller_state
from ghsweep.launch.slurm.submitted_jobs import load_jobs, requeued
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.slurm.cluster import sacct_states
from tests.support.cli import start_cli
from tests.support.slurm_sweeps import runs, sweep_args, wait_for

pytestmark = pytest.mark.usefixtures("slurm_cluster")

STEPS = 30


def squeue_field(job_id: str, field: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", field], capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


def start_when_eligible(job_id: str, proc: subprocess.Popen) -> None:
    """SLURM holds a requeued job for its credentials' lifetime (its begin time, reason BeginTime;
    AuthInfo's cred_expire, 20 s on the test cluster: tests/slurm/start_cluster.sh); an administrator's
    `scontrol update StartTime=now` starts it within a second. What ghsweep does around the requeue is
    the same either way. Not after a node went down: on the test cluster, whose two nodes are one host,
    the lost job's processes live on until SLURM cleans them up, and a job started before then on the
    other node fails its launch ("Duplicate jobid"), held."""
    wait_for(
        lambda: "BeginTime" in squeue_field(job_id, "%T %r") or proc.poll() is not None, 120, "the job to be requeued"
    )
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=False)


def requeued_sweep(
    server, tmp_path: Path, experiment: str, stop_job, *more: str, released: bool = True
) -> tuple[subprocess.CompletedProcess, str]:
    """A one-run sweep whose job is stopped by `stop_job(job_id)` once it trains, then `released` from
    SLURM's begin time (start_when_eligible), else left to start when it passes; (the finished sweep,
    job id)."""
    sweep_dir = tmp_path / "sweep"
    args = sweep_args(
        server, experiment, f"train.max_steps={STEPS}", "train.log_every=1", f"hydra.sweep.dir={sweep_dir}", *more
    )
    proc = start_cli(args, tmp_path)
    try:
        wait_for(lambda: (sweep_dir / SLURM_JOBS).exists() or proc.poll() is not None, 300, "the job's submission")
        assert proc.poll() is None, "the sweep ended before it submitted a job"
        (job,) = load_jobs(sweep_dir)
        metrics = Path(job.run_dir) / METRICS
        wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, 240, "the job to train")
        stop_job(job.job_id)
        if released:
            start_when_eligible(job.job_id, proc)
        out, err = proc.communicate(timeout=600)
    except Exception as exc:
        # What the sweep and the cluster said, for a failure here is otherwise silent.
        proc.kill()
        out, err = proc.communicate()
        queue = subprocess.run(["squeue", "-a", "-l"], capture_output=True, text=True, check=False).stdout
        subprocess.run(["scancel", *[j.job_id for j in load_jobs(sweep_dir)]], check=False)
        raise AssertionError(f"{exc}\nsweep output:\n{out[-3000:]}{err[-3000:]}\nsqueue:\n{queue}") from exc
    return subprocess.CompletedProcess(args, proc.returncode, out, err), job.job_id


def assert_finished_on_its_second_start(server, experiment: str, proc, job_id: str, after: str) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sacct_states([job_id])[job_id] == "COMPLETED"
    (child,) = runs(server, experiment, "run")  # one MLflow run, continued by the requeued job
    assert child.status == "FINISHED"
    assert child.tags["ghsweep.attempts"] == "2"
    assert child.tags["ghsweep.attempt.1"].startswith(f"infrastructure: SLURM job {job_id} was requeued after {after}")
    assert "ghsweep.error" not in child.tags and "ghsweep.failure_class" not in child.tags
    steps = [step for step, _ in MlflowStore(server.url, experiment=None).metric_history(child.run_id, "loss")]
    assert len(steps) == len(set(steps)) == STEPS  # the second start's curve alone, whole
    result = json.loads((Path(child.tags["ghsweep.run_dir"]) / "result.json").read_text())
    assert (result["status"], len(result["attempts"]), result["mlflow_run_id"]) == ("FINISHED", 1, child.run_id)
    assert "1 of 1 runs finished" in proc.stdout


def test_a_job_requeued_with_scontrol_starts_over_and_finishes_in_the_same_run(mlflow_server, tmp_path):
    proc, job_id = requeued_sweep(
        mlflow_server, tmp_path, "slurm_requeue", lambda job: subprocess.run(["scontrol", "requeue", job], check=True)
    )
    assert_finished_on_its_second_start(mlflow_server, "slurm_requeue", proc, job_id, "REQUEUED")


def test_a_job_signalled_with_usr2_starts_over_and_finishes_in_the_same_run(mlflow_server, tmp_path):
    # A preemption notice: USR2 to the job's steps (scancel's default, not the batch shell), where
    # srun runs submitit's process, whose handler requeues the job.
    proc, job_id = requeued_sweep(
        mlflow_server,
        tmp_path,
        "slurm_usr2",
        lambda job: subprocess.run(["scancel", "--signal=USR2", job], check=True),
    )
    assert_finished_on_its_second_start(mlflow_server, "slurm_usr2", proc, job_id, "REQUEUED")


def test_a_job_whose_node_goes_down_starts_over_on_the_other_node(mlflow_server, tmp_path):
    downed: list[str] = []

    def take_its_node_down(job: str) -> None:
        node = squeue_field(job, "%N")
        downed.append(node)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=ghsweep test"], check=True)

    try:
        proc, job_id = requeued_sweep(mlflow_server, tmp_path, "slurm_node_down", take_its_node_down, released=False)
    finally:
        for node in downed:
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    assert_finished_on_its_second_start(mlflow_server, "slurm_node_down", proc, job_id, "NODE_FAIL")


def test_a_job_whose_node_failed_counts_as_ended_only_when_the_controller_did_not_requeue_it(tmp_path):
    """sacct reports NODE_FAIL for a moment after a node is lost even for a job the controller has
    already requeued (seen at 0.1 s, PENDING by 3 s on the test cluster): the sweep must keep waiting
    for that one, and stop waiting for one that cannot be requeued."""
    jobs: list[str] = []
    nodes: list[str] = []

    def job_on_a_downed_node(requeue: str) -> str:
        job = subprocess.run(
            ["sbatch", "--parsable", requeue, "-o", str(tmp_path / "%j.out"), "--wrap", "sleep 600"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        jobs.append(job)
        wait_for(lambda: controller_state(job) == "RUNNING", 120, f"job {job} to run")
        nodes.append(squeue_field(job, "%N"))
        subprocess.run(["scontrol", "update", f"nodename={nodes[-1]}", "state=down", "reason=ghsweep test"], check=True)
        wait_for(lambda: controller_state(job) not in (None, "RUNNING", "COMPLETING"), 60, f"job {job} to stop")
        subprocess.run(["scontrol", "update", f"nodename={nodes[-1]}", "state=resume"], check=False)
        return job

    try:
        requeueable, not_requeueable = job_on_a_downed_node("--requeue"), job_on_a_downed_node("--no-requeue")
        assert controller_state(requeueable) == "PENDING"
        assert requeued("NODE_FAIL", requeueable)
        assert controller_state(not_requeueable) == "NODE_FAIL"
        assert not requeued("NODE_FAIL", not_requeueable)
        assert not requeued("FAILED", requeueable)  # only a state SLURM requeues after
    finally:
        subprocess.run(["scancel", *jobs], check=False)
        for node in nodes:
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
