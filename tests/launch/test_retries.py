"""Failures told apart and retried, on real local sweeps: a worker killed from outside (here, by the
test) is an infrastructure failure, run again in the same run directory and MLflow run; a Python
error in the backend is deterministic and never run again; a bad `retries` is one line before
anything is recorded."""

from __future__ import annotations

import os
import signal

import pytest

from ghsweep.launch.worker_process import worker_pid
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.support.cli import run_cli, start_cli
from tests.support.compose import compose_config
from tests.support.mlflow_records import all_runs, assert_nothing_running, by_role, sqlite_uri
from tests.support.stopped_sweep import wait_until_training
from tests.support.sweep_dirs import results

STEPS = 6
# Job 0 packs its one example into fewer blocks than a micro-batch: the worker raises (deterministic).
# Job 1 trains; the test kills its worker once it has logged a step.
SWEEP = [
    "-m",
    "experiment=smoke",
    "train.seq_length=64",
    f"train.max_steps={STEPS}",
    "train.log_every=1",
    "train.micro_batch_size=2",
    "data.num_examples=1,64",
    "hydra.launcher.retries=1",
]


@pytest.fixture(scope="module")
def retried_sweep(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("retries")
    sweep_dir = cwd / "sweep"
    proc = start_cli([*SWEEP, f"hydra.sweep.dir={sweep_dir}"], cwd)
    try:
        killed = wait_until_training(sweep_dir / "1", proc, max_steps=STEPS, timeout_s=600)
        os.kill(killed, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    return cwd, sweep_dir, killed, proc.returncode, stdout, stderr


def test_a_worker_killed_from_outside_is_run_again_and_finishes_in_the_same_mlflow_run(retried_sweep):
    cwd, sweep_dir, killed, returncode, stdout, stderr = retried_sweep
    assert returncode == 1, stderr[-3000:]  # job 0's Python error fails the sweep
    run_dir = sweep_dir / "1"
    on_disk = results(sweep_dir)[1]
    reason = "worker killed by SIGKILL (killed from outside, often the out-of-memory killer)"
    assert (on_disk["status"], on_disk["attempts"], on_disk["failure_class"]) == ("FINISHED", [reason], None)
    assert worker_pid(run_dir) != killed  # a new worker trained
    assert (run_dir / "worker.attempt1.log").exists() and (run_dir / "worker.log").exists()

    runs = all_runs(sqlite_uri(cwd))
    assert_nothing_running(runs)
    children = sorted(by_role(runs, "run"), key=lambda r: int(r.tags["ghsweep.job_num"]))
    assert [c.tags["ghsweep.job_num"] for c in children] == ["0", "1"]  # one MLflow run per combination
    retried = children[1]
    assert retried.run_id == on_disk["mlflow_run_id"] and retried.status == "FINISHED"
    assert retried.tags["ghsweep.attempts"] == "2"
    assert retried.tags["ghsweep.attempt.1"] == f"infrastructure: {reason}"
    assert "ghsweep.failure_class" not in retried.tags and "ghsweep.error" not in retried.tags
    # The loss curve is the finished attempt's alone: one point per step, none of the killed attempt's.
    store = MlflowStore(sqlite_uri(cwd), "ghsweep")
    steps = [m.step for m in store.client.get_metric_history(retried.run_id, "loss")]
    assert sorted(steps) == list(range(1, STEPS + 1)) or sorted(steps) == list(range(STEPS)), steps
    artifacts = {a.path for a in store.client.list_artifacts(retried.run_id)}
    assert "worker.attempt1.log" in artifacts
    assert "ran 2 times; earlier attempts: infrastructure: worker killed by SIGKILL" in stdout


def test_a_python_error_in_the_backend_is_deterministic_and_not_run_again(retried_sweep):
    cwd, sweep_dir, _, _, stdout, _ = retried_sweep
    on_disk = results(sweep_dir)[0]
    assert on_disk["error"].startswith("ValueError: train.micro_batch_size=2: the data packs into 1 block(s)")
    assert (on_disk["status"], on_disk["failure_class"], on_disk["attempts"]) == ("FAILED", "deterministic", [])
    assert not (sweep_dir / "0" / "worker.attempt1.log").exists()
    [failed] = [r for r in by_role(all_runs(sqlite_uri(cwd)), "run") if r.tags["ghsweep.job_num"] == "0"]
    assert (failed.status, failed.tags["ghsweep.failure_class"], failed.tags["ghsweep.attempts"]) == (
        "FAILED",
        "deterministic",
        "1",
    )
    # The comparison shows the class beside the reason.
    assert "#0 1 FAILED: deterministic: ValueError: train.micro_batch_size=2" in stdout


@pytest.mark.parametrize("value", ["-1", "abc", "1.5"])
def test_a_bad_retries_value_is_one_line_before_anything_is_recorded(tmp_path, value):
    proc = run_cli(["-m", "experiment=smoke", "precision=fp32,bf16", f"hydra.launcher.retries={value}"], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"ghsweep: hydra.launcher.retries={value}: must be a whole number >= 0 (how many times a run that "
        "failed for its node, network or GPU hardware is run again; 0: never)"
    ], proc.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "multirun").exists()


def test_launch_profiles_retry_once_on_slurm_and_never_locally():
    for launcher, retries in (("local", 0), ("local_slurm", 1), ("gh200", 1)):
        cfg = compose_config(f"hydra/launcher={launcher}", hydra=True)
        assert cfg.hydra.launcher.retries == retries, launcher
