"""Sweeps through the Hydra submitit launcher on a real single-node SLURM cluster (tests/slurm/).

Jobs log to a real MLflow tracking server, the one the profile names, as on a cluster whose compute
nodes cannot share a SQLite file. Every job trains the tiny smoke model for a few steps in fp32 on one CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ghsweep.core.run_dir import SLURM_JOBS
from ghsweep.launch.slurm.submitted_jobs import load_jobs
from ghsweep.tracking.mlflow_store import MlflowStore
from ghsweep.train.dolly_data import synthetic_dolly, write_dolly_jsonl
from tests.slurm.cluster import sacct_states, started_cluster
from tests.support.cli import assert_one_line_errors, run_cli, start_cli
from tests.support.disks import unstartable_run_dirs
from tests.support.models import UNREADABLE_WEIGHTS_ERROR, unreadable_model
from tests.support.slurm_sweeps import runs, sweep_args, wait_for

# About five minutes alone (tests/DURATIONS.md); test_slurm_job_results.py covers collect_results in seconds.
pytestmark = pytest.mark.usefixtures("slurm_cluster")

RUN_METRICS = {"loss", "step_time_ms", "tokens_per_s", "peak_mem_gb", "final_loss"}


def job_ids(sweep_dir: Path) -> list[str]:
    return [j.job_id for j in load_jobs(sweep_dir)]


def artifacts(server, run_id: str, path: str | None = None) -> set[str]:
    return MlflowStore(server.url, experiment=None).artifact_paths(run_id, path)


def test_failing_job_is_failed_with_its_slurm_log(mlflow_server, tmp_path):
    model = unreadable_model(tmp_path / "model")
    proc = run_cli(sweep_args(mlflow_server, "slurm_fail", f"model.path={model}", "train.max_steps=2"), tmp_path)
    assert proc.returncode != 0
    assert "1 of 1 runs failed" in proc.stderr
    (child,) = runs(mlflow_server, "slurm_fail", "run")
    assert child.status == "FAILED"
    assert child.tags["ghsweep.error"] == UNREADABLE_WEIGHTS_ERROR
    assert "worker.log" in artifacts(mlflow_server, child.run_id)
    slurm_logs = artifacts(mlflow_server, child.run_id, "slurm")
    assert any(p.endswith("_log.out") for p in slurm_logs) and any(p.endswith("_log.err") for p in slurm_logs)


def test_jobs_that_hydra_cannot_start_are_failed_with_what_they_are_and_the_sweep_ends_whole(mlflow_server, tmp_path):
    sweep_dir, victim = tmp_path / "sweep", tmp_path / "victim"
    with unstartable_run_dirs(sweep_dir, victim) as said:
        args = sweep_args(mlflow_server, "slurm_unstartable", "train.max_steps=2,3,4,5", "hydra.sweep.dir=sweep")
        proc = run_cli(args, tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert "1 of 4 runs finished" in proc.stdout and list(victim.iterdir()) == []
    (parent,) = runs(mlflow_server, "slurm_unstartable", "sweep")
    assert parent.status == "FAILED"
    children = {c.job_num: c for c in runs(mlflow_server, "slurm_unstartable", "run")}
    assert {n: c.status for n, c in children.items()} == {0: "FINISHED", 1: "FAILED", 2: "FAILED", 3: "FAILED"}
    for num, error in said.items():
        assert children[num].error.startswith(error), children[num].error
        assert error[:40] in proc.stdout + proc.stderr


def test_job_cancelled_with_scancel_ends_killed_and_the_sweep_ends(mlflow_server, tmp_path):
    sweep_dir = tmp_path / "sweep"
    # Combination 1 trains long enough to be cancelled while it runs.
    args = sweep_args(mlflow_server, "slurm_cancel", "train.max_steps=3,5000", f"hydra.sweep.dir={sweep_dir}")
    proc = start_cli(args, tmp_path)
    try:
        wait_for(lambda: (sweep_dir / SLURM_JOBS).exists(), 120, "the sweep's jobs to be submitted")
        long_job = next(j for j in load_jobs(sweep_dir) if j.num == 1)
        metrics = Path(long_job.run_dir) / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, 180, "the long job to train")
        subprocess.run(["scancel", long_job.job_id], check=True)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["scancel", *job_ids(sweep_dir)], check=False)
    assert proc.returncode != 0
    assert "1 of 2 runs failed" in err
    assert sacct_states([long_job.job_id])[long_job.job_id].startswith("CANCELLED")
    children = {c.params["train.max_steps"]: c for c in runs(mlflow_server, "slurm_cancel", "run")}
    assert children["3"].status == "FINISHED"
    cancelled = children["5000"]
    assert cancelled.status == "KILLED"
    assert cancelled.tags["ghsweep.error"].startswith(f"SLURM job {long_job.job_id} was cancelled from outside")
    assert any(p.endswith("_log.err") for p in artifacts(mlflow_server, cancelled.run_id, "slurm"))
    assert json.loads((Path(long_job.run_dir) / "result.json").read_text())["status"] == "KILLED"
    (parent,) = runs(mlflow_server, "slurm_cancel", "sweep")
    assert parent.status == "FAILED"
    # Collecting the ended sweep again changes nothing that was recorded.
    again = subprocess.run(
        [sys.executable, "-m", "ghsweep.status", str(sweep_dir)], capture_output=True, text=True, timeout=120
    )
    assert "1 of 2 runs failed" in again.stdout + again.stderr, again.stderr[-2000:]
    (still,) = [c for c in runs(mlflow_server, "slurm_cancel", "run") if c.params["train.max_steps"] == "5000"]
    assert still.tags["ghsweep.error"] == cancelled.tags["ghsweep.error"]
    assert json.loads((Path(long_job.run_dir) / "result.json").read_text())["error"] == cancelled.tags["ghsweep.error"]


def test_time_limit_without_resumable_backend_is_recorded_timed_out(mlflow_server, tmp_path):
    # SLURM signals the job signal_delay_s before its 2-minute limit, or up to 60 s earlier (its event
    # resolution): 30-90 s after it starts, while it trains.
    proc = run_cli(
        sweep_args(
            mlflow_server,
            "slurm_timeout",
            "train.max_steps=5000",
            "hydra.launcher.timeout_min=2",
            "hydra.launcher.signal_delay_s=30",
        ),
        tmp_path,
    )
    assert proc.returncode != 0
    (child,) = runs(mlflow_server, "slurm_timeout", "run")
    assert child.status == "FAILED"
    error = child.tags["ghsweep.error"]
    assert error.startswith("timed out: the SLURM time limit (2 min")
    assert "cannot resume" in error and "not requeued" in error
    assert "worker.log" in artifacts(mlflow_server, child.run_id)
    # Stopped at the signal, before SLURM's own kill at the limit: SLURM accounts the 2-minute limit it
    # was given, and the job ended inside it on its own (a job SLURM kills at the limit ends TIMEOUT).
    (sweep_dir,) = [p.parent for p in tmp_path.glob(f"multirun/*/*/{SLURM_JOBS}")]
    (job_id,) = job_ids(sweep_dir)
    state, limit, elapsed = (
        subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "State,Timelimit,Elapsed", "-j", job_id],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .split("|")
    )
    assert limit == "00:02:00" and state != "TIMEOUT" and elapsed < limit, (state, limit, elapsed)


def test_resume_skips_finished_and_reruns_failed(mlflow_server, tmp_path):
    good, late = tmp_path / "good.jsonl", tmp_path / "late.jsonl"
    write_dolly_jsonl(synthetic_dolly(64, seed=1), good)
    # One example packs into one block, fewer than a micro-batch of two: only the worker can tell.
    write_dolly_jsonl(synthetic_dolly(1, seed=2), late)
    common = ("data=dolly_file", f"data.path={good},{late}", "train.max_steps=2", "train.micro_batch_size=2")

    first = run_cli(sweep_args(mlflow_server, "slurm_resume", *common, f"hydra.sweep.dir={tmp_path / 's1'}"), tmp_path)
    assert first.returncode != 0 and "1 of 2 runs failed" in first.stderr
    write_dolly_jsonl(synthetic_dolly(64, seed=2), late)

    second = run_cli(sweep_args(mlflow_server, "slurm_resume", *common, f"hydra.sweep.dir={tmp_path / 's2'}"), tmp_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resume: 1 of 2 combinations already FINISHED" in second.stdout
    assert [[o for o in j.overrides if o.startswith("data.path=")] for j in load_jobs(tmp_path / "s2")] == [
        [f"data.path={late}"]
    ]
    assert "2 of 2 runs finished" in second.stdout

    children = runs(mlflow_server, "slurm_resume", "run")
    by_path = {}
    for c in children:
        by_path.setdefault(c.params["data.path"], []).append(c.status)
    assert sorted(by_path[str(good)]) == ["FINISHED"]
    assert sorted(by_path[str(late)]) == ["FAILED", "FINISHED"]

    forced = run_cli(
        sweep_args(
            mlflow_server,
            "slurm_resume",
            "data=dolly_file",
            f"data.path={good}",
            "train.max_steps=2",
            "force=true",
            f"hydra.sweep.dir={tmp_path / 's3'}",
        ),
        tmp_path,
    )
    assert forced.returncode == 0
    assert len(load_jobs(tmp_path / "s3")) == 1
    again = [c for c in runs(mlflow_server, "slurm_resume", "run") if c.params["data.path"] == str(good)]
    assert sorted(c.status for c in again) == ["FINISHED", "FINISHED"]


def test_eight_jobs_finishing_at_once_lose_nothing(mlflow_server, tmp_path):
    """A 2x2x2 smoke sweep: its eight jobs run at once on the two nodes, and each one's run is recorded
    whole under the sweep's run."""
    proc = run_cli(
        sweep_args(
            mlflow_server,
            "slurm_eight",
            "peft=lora,none",
            "offload=off,on",
            "dataloader=default,sync",
            "train.max_steps=4",
        ),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The sweep directory has ${now:} in it: the jobs, in other processes, must find the same one.
    (sweep_dir,) = [p.parent for p in tmp_path.glob(f"multirun/*/*/{SLURM_JOBS}")]
    ids = job_ids(sweep_dir)
    assert len(ids) == 8 and set(sacct_states(ids).values()) == {"COMPLETED"}
    # They ran at the same time: each one's training overlaps every other one's.
    spans = [json.loads((Path(j.run_dir) / "summary.json").read_text()) for j in load_jobs(sweep_dir)]
    assert len(spans) == 8

    (parent,) = runs(mlflow_server, "slurm_eight", "sweep")
    assert parent.status == "FINISHED"
    children = runs(mlflow_server, "slurm_eight", "run")
    assert len(children) == 8 and {c.status for c in children} == {"FINISHED"}
    store = MlflowStore(mlflow_server.url, experiment=None)
    for child in children:
        assert child.tags["mlflow.parentRunId"] == parent.run_id
        assert Path(child.tags["ghsweep.run_dir"]).parent == sweep_dir.resolve()
        assert RUN_METRICS <= set(child.metrics)
        assert [step for step, _ in store.metric_history(child.run_id, "loss")] == [0, 1, 2, 3]
    assert {(c.params["peft"], c.params["offload"], c.params["dataloader"]) for c in children} == {
        (peft, offload, dataloader)
        for peft in ("lora", "none")
        for offload in ("off", "on")
        for dataloader in ("default", "sync")
    }
    assert "8 of 8 runs finished" in proc.stdout


def test_wait_false_returns_at_once_and_status_collects_later(mlflow_server, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(
        sweep_args(
            mlflow_server,
            "slurm_nowait",
            "offload=off,on",
            "train.max_steps=3",
            "wait=false",
            f"hydra.sweep.dir={sweep_dir}",
        ),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"python -m ghsweep.status {sweep_dir}" in proc.stdout
    (parent,) = runs(mlflow_server, "slurm_nowait", "sweep")
    assert parent.status == "RUNNING"

    status = [sys.executable, "-m", "ghsweep.status", str(sweep_dir)]
    look = subprocess.run(status, capture_output=True, text=True, timeout=120)
    assert look.returncode == 0, look.stderr
    for job_id in job_ids(sweep_dir):
        assert f"job {job_id}" in look.stdout

    collect = subprocess.run([*status, "--wait", "--poll-s", "2"], capture_output=True, text=True, timeout=600)
    assert collect.returncode == 0, collect.stderr[-3000:]
    assert "2 of 2 runs finished" in collect.stdout
    (parent,) = runs(mlflow_server, "slurm_nowait", "sweep")
    assert parent.status == "FINISHED"
    assert {c.status for c in runs(mlflow_server, "slurm_nowait", "run")} == {"FINISHED"}


def test_one_combination_on_two_nodes_runs_four_ranks(mlflow_server, tmp_path):
    """backend.num_nodes=2 x gpus_per_node=2: one job on both nodes of the cluster, srun's 4 tasks train
    one gloo world (rendezvous from SLURM's environment), rank 0 records it."""
    proc = run_cli(
        sweep_args(mlflow_server, "slurm_world", "backend.num_nodes=2", "backend.gpus_per_node=2", "train.max_steps=3"),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (sweep_dir,) = [p.parent for p in tmp_path.glob(f"multirun/*/*/{SLURM_JOBS}")]
    (job_id,) = job_ids(sweep_dir)
    accounted = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "State,NNodes,NTasks,NodeList", "-j", job_id],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("|")
    assert accounted[:2] == ["COMPLETED", "2"] and accounted[3].strip() == "node[1-2]"
    (child,) = runs(mlflow_server, "slurm_world", "run")
    assert child.status == "FINISHED", child.tags.get("ghsweep.error")
    m = child.metrics
    assert m["world_size"] == 4 and m["tokens_per_s_per_gpu"] == pytest.approx(m["tokens_per_s"] / 4)
    assert len(child.tags["ghsweep.rank_step_time_ms"].split()) == 4
    assert len(MlflowStore(mlflow_server.url, experiment=None).metric_history(child.run_id, "loss")) == 3
    run_dir = Path(child.tags["ghsweep.run_dir"])
    for rank in (1, 2, 3):
        assert json.loads((run_dir / f"rank{rank}.json").read_text())["status"] == "FINISHED"
        assert (run_dir / f"worker.rank{rank}.log").exists()
    # Only rank 0's task made an MLflow run.
    assert len(runs(mlflow_server, "slurm_world", "run")) == 1


def test_another_cluster_on_the_host_stopping_leaves_this_one_working(tmp_path):
    # Test sessions in parallel (pytest-xdist workers, two checkouts) each start a cluster on one host;
    # one stopping must not take the others' authentication (munged) with it.
    with started_cluster():
        pass
    job = subprocess.run(
        ["sbatch", "--parsable", "-o", str(tmp_path / "%j.out"), "--wrap", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.strip()
    wait_for(lambda: sacct_states([job_id])[job_id] == "COMPLETED", 120, f"job {job_id} to complete")
