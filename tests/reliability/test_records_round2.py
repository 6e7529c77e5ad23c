"""Records that were lost or left RUNNING: a second Ctrl-C while the sweep records what finished, a
result.json cut short, an empty sweep manifest (a kill between claiming the directory and saving it),
a metrics.jsonl line cut short (a kill as the worker wrote it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from ghsweep.launch.job import loss_points
from tests.support.cli import assert_one_line_errors, run_cli
from tests.support.mlflow_records import all_runs, assert_nothing_running, by_role, sqlite_uri
from tests.support.stopped_sweep import start_sweep, wait_until_training
from tests.support.sweep_dirs import results


def status(cwd: Path, sweep_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ghsweep.status", sweep_dir], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_a_second_ctrl_c_does_not_break_off_the_record(tmp_path):
    proc = start_sweep(tmp_path, "twice")
    wait_until_training(tmp_path / "twice" / "1", proc)
    proc.send_signal(signal.SIGINT)
    # Soon enough to land while the sweep records (stopping the worker alone takes longer), late
    # enough that the first one has been handled: signals that wait together are delivered as one.
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert_one_line_errors(stdout, stderr)
    assert "ghsweep: SIGINT again: already stopping; recording what finished first" in stderr
    assert stderr.strip().splitlines()[-1].startswith("ghsweep: interrupted by SIGINT (Ctrl-C); to resume the sweep")
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    [parent] = by_role(runs, "sweep")
    assert parent.status == "KILLED"
    assert {n: r["status"] for n, r in results(tmp_path / "twice").items()} == {0: "FINISHED", 1: "KILLED"}


def test_status_reads_a_cut_result_from_mlflow_and_ends_the_sweep(tmp_path):
    sweep = run_cli(
        ["-m", "experiment=smoke", "precision=fp32", "train.max_steps=2", "train.seq_length=64", "hydra.sweep.dir=cut"],
        tmp_path,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    [parent] = by_role(all_runs(sqlite_uri(tmp_path)), "sweep")
    # As a kill -9 of the sweep leaves it: the parent RUNNING under a dead process, a result.json cut short.
    MlflowClient(sqlite_uri(tmp_path)).update_run(parent.run_id, status="RUNNING")
    result = tmp_path / "cut" / "0" / "result.json"
    result.write_text(result.read_text()[:40])
    (tmp_path / "cut" / "ghsweep_end.json").unlink()  # written as the sweep's end: a kill -9 leaves none
    proc = status(tmp_path, "cut")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert "1 of 1 runs finished" in proc.stdout
    assert "cut/0/result.json: unreadable" in proc.stderr
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    assert [r.status for r in by_role(runs, "sweep")] == ["FINISHED"]


def test_status_on_an_empty_manifest_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "ghsweep_sweep.json").write_text("")
    proc = status(tmp_path, "empty")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"ghsweep.status: {Path('empty') / 'ghsweep_sweep.json'}: empty or cut short: the sweep stopped before its "
        "first job and recorded no run; the same command starts it again there"
    )
    assert not (tmp_path / "mlflow.db").exists()


def test_a_cut_metrics_line_is_left_out_and_the_rest_recorded(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 3.0 - s, "step_time_ms": 5.0, "tokens": 64} for s in (1, 2)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "lo')
    assert loss_points(metrics) == [("loss", 2.0, 1), ("loss", 1.0, 2)]
