"""Full and read-only disks, on a small tmpfs: said as what they are, at once, for the store as for the
sweep directory; the sweep goes on and ends whole, and nothing the runs measured is lost."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import pytest

from ghsweep.core.errors import TrackingError
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.support.cli import assert_one_line_errors, run_cli
from tests.support.disks import small_tmpfs, unstartable_run_dirs
from tests.support.mlflow_records import all_runs, assert_nothing_running, by_role, sqlite_uri
from tests.support.stopped_sweep import start_sweep, wait_until_training
from tests.support.sweep_dirs import results


def fill(disk: Path) -> None:
    """Fill `disk` to its last byte."""
    with open(disk / "filler", "wb") as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"\0" * 65536)
            filler.flush()


@pytest.mark.parametrize("how", ["full", "read-only"])
def test_a_store_on_a_full_or_read_only_disk_is_said_at_once_not_retried_as_busy(tmp_path, how):
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        store = MlflowStore(f"sqlite:///{disk / 'mlflow.db'}", "ghsweep")
        run_id = store.start_run("run", "run", tags={})
        if how == "full":
            fill(disk)
        else:  # the same files seen through a read-only mount, as a file system remounted read-only
            store = read_only_view(disk, tmp_path / "read-only")
        started = time.monotonic()
        with pytest.raises(TrackingError) as failed:
            store.log_metrics(run_id, [("loss", 1.0, step) for step in range(20000)])
        took = time.monotonic() - started
        if how == "read-only":
            subprocess.run(["umount", "-l", str(tmp_path / "read-only")], check=True)
    said = {"full": "database or disk is full", "read-only": "attempt to write a readonly database"}[how]
    assert str(failed.value).startswith("the store cannot write: ") and said in str(failed.value)
    assert took < 20, f"{took:.0f} s: retried as a busy store"


def read_only_view(disk: Path, view: Path) -> MlflowStore:
    view.mkdir()
    subprocess.run(["mount", "--bind", str(disk), str(view)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
    return MlflowStore(f"sqlite:///{view / 'mlflow.db'}", "ghsweep")


@pytest.mark.parametrize("how", ["full", "read-only"])
def test_a_sweep_directory_that_fills_or_turns_read_only_fails_the_runs_it_touches_and_the_sweep_ends_whole(
    tmp_path, how
):
    with small_tmpfs(tmp_path / "sweep", "8m") as sweep_dir:
        proc = start_sweep(tmp_path, "sweep")
        wait_until_training(sweep_dir / "1", proc)
        if how == "full":
            fill(sweep_dir)
        else:  # remounted read-only under the sweep: files it holds open go on, none can be made
            subprocess.run(["mount", "--bind", str(sweep_dir), str(sweep_dir)], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(sweep_dir)], check=True)
        try:
            stdout, stderr = proc.communicate(timeout=300)
        finally:
            if how == "read-only":
                subprocess.run(["umount", "-l", str(sweep_dir)], check=True)
        job_0 = results(sweep_dir)[0]
    assert proc.returncode == 1, stderr[-3000:]
    assert_one_line_errors(stdout, stderr)
    assert "--- Logging error ---" not in stderr
    assert "1 of 3 runs finished" in stdout, stdout[-3000:]
    assert job_0["status"] == "FINISHED"  # what it measured stays on disk
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    assert [p.status for p in by_role(runs, "sweep")] == ["FAILED"]
    children = {c.job_num: c for c in by_role(runs, "run")}
    said = {"full": "no space left on device under {}", "read-only": "the file system of {} is read-only"}[how]
    assert children[0].status == "FINISHED"
    for num in (1, 2):  # the run on the disk as it went, and the next, which Hydra could not start
        assert children[num].status == "FAILED"
        assert children[num].error.startswith(said.format(sweep_dir / str(num))), children[num].error


def test_submitted_jobs_that_hydra_cannot_start_are_recorded_failed_and_the_sweep_ends_whole(tmp_path):
    # The jobs start their combinations as SLURM jobs do, through submitit (here its local executor).
    sweep_dir, victim = tmp_path / "sweep", tmp_path / "victim"
    with unstartable_run_dirs(sweep_dir, victim) as said:
        proc = run_cli(
            [
                "-m",
                "hydra/launcher=submitit_local",
                "experiment=smoke",
                "precision=fp32",
                "train.max_steps=2,3,4,5",
                "train.seq_length=64",
                "hydra.sweep.dir=sweep",
            ],
            tmp_path,
        )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert "1 of 4 runs finished" in proc.stdout, proc.stdout[-3000:]
    assert list(victim.iterdir()) == []
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    assert [p.status for p in by_role(runs, "sweep")] == ["FAILED"]
    children = {c.job_num: c for c in by_role(runs, "run")}
    assert {n: c.status for n, c in children.items()} == {0: "FINISHED", 1: "FAILED", 2: "FAILED", 3: "FAILED"}
    for num, error in said.items():
        assert children[num].error.startswith(error), children[num].error
        assert error[:40] in proc.stdout + proc.stderr  # said on the console, not only in the job's log
