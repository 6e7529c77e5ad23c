"""Stopping a real local sweep: Ctrl-C (SIGINT) or SIGTERM stops the running worker, records that run
and the sweep KILLED with the reason, prints what finished and exits 130/143; the same command then
resumes. A sweep killed outright (SIGKILL) leaves RUNNING runs, which `python -m ghsweep.status` or the
next sweep ends FAILED with "the sweep process died", stopping the worker it left behind; a run whose
worker had finished (the sweep killed as it analysed the run's profile) is recorded FINISHED from its run
directory."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ghsweep.launch.worker_process import worker_pid
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.support.cli import assert_one_line_errors, run_cli, start_cli
from tests.support.mlflow_records import all_runs, assert_nothing_running, by_role, sqlite_uri
from tests.support.stopped_sweep import SWEEP, start_sweep, wait_until_training
from tests.support.sweep_dirs import results


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive(pid)


@pytest.mark.parametrize("stop, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_sweep_ends_killed_with_its_summary_and_resumes(tmp_path, stop, status):
    proc = start_sweep(tmp_path, "first")
    worker = wait_until_training(tmp_path / "first" / "1", proc)
    proc.send_signal(stop)
    stdout, stderr = proc.communicate(timeout=120)
    reason = f"interrupted by {stop.name}" + (" (Ctrl-C)" if stop == signal.SIGINT else "")
    assert proc.returncode == status, stderr[-3000:]
    # The command to paste: the default sweep directory is named by the second, so it names this one.
    resume = ["python", "-m", "ghsweep", *SWEEP, "hydra.sweep.dir=first"]
    assert stderr.strip().splitlines()[-1] == (
        f"ghsweep: {reason}; to resume the sweep in this directory and MLflow run (runs that finished are "
        f"skipped): {shlex.join(resume)}"
    )
    assert_one_line_errors(stdout, stderr)
    assert "1 of 3 runs finished; 1 not started" in stdout and reason in stdout
    assert wait_gone(worker), "the worker outlived the sweep"

    on_disk = results(tmp_path / "first")
    assert {n: (r["status"], r["error"]) for n, r in on_disk.items()} == {0: ("FINISHED", None), 1: ("KILLED", reason)}
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    [parent] = by_role(runs, "sweep")
    assert parent.status == "KILLED" and parent.tags["ghsweep.error"] == reason
    children = {int(c.tags["ghsweep.job_num"]): c for c in by_role(runs, "run")}
    assert children[0].status == "FINISHED"
    assert children[1].status == "KILLED" and children[1].tags["ghsweep.error"] == reason
    assert "worker.log" in MlflowStore(sqlite_uri(tmp_path), experiment=None).artifact_paths(children[1].run_id)

    if stop == signal.SIGINT:  # resuming is the same for both signals: run it once
        # The command it printed: resumed in place, under the same MLflow run.
        again = run_cli(resume[3:], tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "3 of 3 runs finished" in again.stdout and "skipped, already FINISHED" in again.stdout
        [resumed_parent] = by_role(all_runs(sqlite_uri(tmp_path)), "sweep")
        assert (resumed_parent.run_id, resumed_parent.status) == (parent.run_id, "FINISHED")
        assert "ghsweep.error" not in resumed_parent.tags
        resumed = results(tmp_path / "first")
        assert [resumed[n]["status"] for n in range(3)] == ["FINISHED"] * 3
        assert resumed[0]["mlflow_run_id"] == children[0].run_id  # not trained again
        assert_nothing_running(all_runs(sqlite_uri(tmp_path)))


def kill_in_the_middle(cwd: Path, sweep_dir: str) -> int:
    """SIGKILL the sweep while job 1 trains; the pid of the worker it leaves behind."""
    proc = start_sweep(cwd, sweep_dir)
    worker = wait_until_training(cwd / sweep_dir / "1", proc)
    # Held silent, as a worker compiling or in a long step is: a worker that prints after its sweep
    # died ends by itself on the closed pipe, and only a silent one is left for the settling to stop.
    os.kill(worker, signal.SIGSTOP)
    proc.kill()
    proc.communicate(timeout=60)
    runs = all_runs(sqlite_uri(cwd))
    assert sorted(r.status for r in runs) == ["FINISHED", "RUNNING", "RUNNING"]
    assert alive(worker)
    return worker


def assert_settled_as_died(cwd: Path, sweep_dir: str, worker: int) -> None:
    assert wait_gone(worker), "the orphaned worker was not stopped"
    runs = all_runs(sqlite_uri(cwd))
    assert_nothing_running(runs)
    parent = next(r for r in by_role(runs, "sweep") if r.tags["ghsweep.sweep_dir"].endswith(sweep_dir))
    assert parent.status == "FAILED"
    died = [c for c in by_role(runs, "run") if c.tags["mlflow.parentRunId"] == parent.run_id and c.status == "FAILED"]
    assert len(died) == 1 and died[0].tags["ghsweep.error"].startswith("the sweep process died (pid ")
    assert results(cwd / sweep_dir)[1]["status"] == "FAILED"


def test_a_killed_sweep_is_settled_by_ghsweep_status(tmp_path):
    worker = kill_in_the_middle(tmp_path, "killed")
    status = subprocess.run(
        [sys.executable, "-m", "ghsweep.status", "killed"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert status.returncode == 1 and "1 of 3 runs finished; 1 not started" in status.stdout, status.stderr[-3000:]
    assert "the sweep process died (pid " in status.stdout
    assert_one_line_errors(status.stdout, status.stderr)
    assert_settled_as_died(tmp_path, "killed", worker)


def test_a_killed_sweep_is_settled_by_the_next_sweep(tmp_path):
    worker = kill_in_the_middle(tmp_path, "killed")
    # Any sweep into the experiment on this host settles it; a short one keeps the test short.
    again = run_cli(
        ["-m", "experiment=smoke", "precision=bf16", "train.max_steps=2", "hydra.sweep.dir=again"], tmp_path
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 of 1 runs finished" in again.stdout
    assert_settled_as_died(tmp_path, "killed", worker)


def test_a_sweep_killed_while_it_analyses_a_finished_run_records_it_finished_and_resumes(tmp_path):
    # One combination: the case is its record; the resume's part is to take the run as it was settled.
    sweep = ["-m", "experiment=smoke", "precision=fp32", "profile=torch", "train.max_steps=4", "train.seq_length=64"]
    proc = start_cli([*sweep, "hydra.sweep.dir=cut"], tmp_path)
    run_0 = tmp_path / "cut" / "0"
    deadline = time.monotonic() + 300
    while not (run_0 / "summary.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    assert wait_gone(worker_pid(run_0), timeout_s=30)
    time.sleep(0.2)  # the worker has exited: the sweep analyses its PyTorch trace (about a second)
    proc.kill()
    proc.communicate(timeout=60)
    assert results(tmp_path / "cut")[0]["status"] == "RUNNING" and not (run_0 / "report.md").exists()

    status = subprocess.run(
        [sys.executable, "-m", "ghsweep.status", "cut"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert_one_line_errors(status.stdout, status.stderr)
    assert "recorded FINISHED in MLflow from its run directory" in status.stderr, status.stderr[-3000:]
    assert status.returncode == 0 and "1 of 1 runs finished" in status.stdout
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    [child_0] = by_role(runs, "run")
    assert child_0.status == "FINISHED" and child_0.tags["ghsweep.status"] == "FINISHED"
    measured = json.loads((run_0 / "summary.json").read_text())["metrics"]
    assert measured and {k: child_0.metrics[k] for k in measured} == pytest.approx(measured)
    assert "train_s" in child_0.metrics and any(k.startswith("system/") for k in child_0.metrics)
    assert "the sweep process died" in child_0.tags["ghsweep.profile_error"]
    assert results(tmp_path / "cut")[0]["status"] == "FINISHED"

    again = run_cli([*sweep, "hydra.sweep.dir=cut"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 of 1 runs finished" in again.stdout and "skipped, already FINISHED" in again.stdout
    assert results(tmp_path / "cut")[0]["mlflow_run_id"] == child_0.run_id  # not trained again
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    assert [p.status for p in by_role(runs, "sweep")] == ["FINISHED"]
