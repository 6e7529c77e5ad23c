"""The sweep directory removed under a running sweep: the run it touches fails with that reason, the sweep
ends whole (its summary from MLflow, exit status 1, nothing RUNNING), and a worker waiting for the
sweep's work on earlier runs finds out in seconds."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from ghsweep.train.torch_train import wait_for_the_sweep
from tests.support.cli import assert_one_line_errors
from tests.support.mlflow_records import all_runs, assert_nothing_running, by_role, sqlite_uri
from tests.support.stopped_sweep import start_sweep, wait_until_training


def test_a_sweep_whose_directory_is_removed_while_it_trains_ends_whole(tmp_path):
    proc = start_sweep(tmp_path, "removed")
    wait_until_training(tmp_path / "removed" / "1", proc)
    shutil.rmtree(tmp_path / "removed")
    stdout, stderr = proc.communicate(timeout=300)

    assert proc.returncode == 1, stderr[-3000:]
    assert_one_line_errors(stdout, stderr)
    # Job 2 runs in a directory Hydra makes again; job 1's files are gone, its row comes from MLflow.
    assert "2 of 3 runs finished" in stdout, stdout[-3000:]
    assert "the run directory" in stdout and "was removed while the run trained" in stdout
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    [parent] = by_role(runs, "sweep")
    assert parent.status == "FAILED"
    children = {c.job_num: c for c in by_role(runs, "run")}
    assert {n: c.status for n, c in children.items()} == {0: "FINISHED", 1: "FAILED", 2: "FINISHED"}
    assert children[1].error.endswith("removed/1 was removed while the run trained")


def test_a_waiting_worker_notices_its_run_directory_removed_in_seconds(tmp_path):
    run_dir = tmp_path / "sweep" / "1"
    run_dir.mkdir(parents=True)
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            wait_for_the_sweep(run_dir / "measure_after")
        except RuntimeError as exc:
            raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    removed = time.monotonic()
    shutil.rmtree(tmp_path / "sweep")
    waiter.join(timeout=30)
    assert not waiter.is_alive() and time.monotonic() - removed < 5
    with pytest.raises(RuntimeError, match="was removed while the run trained"):
        raise raised[0]
