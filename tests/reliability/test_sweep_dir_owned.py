"""The sweep directory belongs to its sweep: a directory of something else is refused untouched; the live
sweep holds it (a lock), so a sweep is judged dead only when it is, whatever PID namespace it runs in;
a sweep stopped as it started is started again by the same command; a run whose record was being made
when the sweep was killed is recorded from its run directory; the status listing skips a directory it
cannot read."""

from __future__ import annotations

import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ghsweep.core.errors import SweepDirInUse
from ghsweep.launch.stale_runs import PID_NS_TAG, PID_TAG, identity, process_died, process_identity, process_tags
from ghsweep.launch.sweep_manifest import NOBODY, SweepManifest, live_holder
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.support.cli import assert_one_line_errors, run_cli, start_cli
from tests.support.mlflow_records import all_runs, assert_nothing_running, by_role, sqlite_uri

ONE_RUN = ["-m", "experiment=smoke", "precision=fp32", "train.max_steps=2", "train.seq_length=64"]


def test_a_directory_that_holds_no_sweep_is_refused_and_left_as_it_was(tmp_path):
    foreign = tmp_path / "results"
    (foreign / "0").mkdir(parents=True)
    (foreign / "0" / "result.json").write_text("theirs")
    (foreign / "summary.md").write_text("theirs")
    proc = run_cli([*ONE_RUN, "hydra.sweep.dir=results"], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ghsweep: hydra.sweep.dir=results: holds files but no sweep (0, summary.md; no ghsweep_sweep.json); a sweep "
        "writes and replaces files in its directory: set hydra.sweep.dir to a new or empty directory"
    )
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert sorted(p.name for p in foreign.rglob("*")) == ["0", "result.json", "summary.md"]
    assert (foreign / "summary.md").read_text() == "theirs" and not (tmp_path / "mlflow.db").exists()


def test_a_sweep_directory_is_held_by_its_live_sweep_alone(tmp_path):
    ours = tmp_path / "ours"
    assert SweepManifest.claim(ours, process_identity()) is False  # a new sweep
    with pytest.raises(SweepDirInUse, match=r"^hydra.sweep.dir=.*ours: a sweep is running in it \(pid "):
        SweepManifest.claim(ours, "another sweep")  # another open of the lock: as another process's
    tags = {**process_tags(), "ghsweep.sweep_dir": str(ours)}
    assert live_holder(ours) == identity(tags) and not process_died(tags)
    # A sweep in another PID namespace (a container with this host name), its pid not seen from here:
    # its lock says it lives.
    theirs = {**tags, PID_NS_TAG: "pid:[1]", PID_TAG: "999999999", "ghsweep.sweep_dir": str(tmp_path / "theirs")}
    SweepManifest.claim(tmp_path / "theirs", identity(theirs))
    assert not process_died(theirs)
    # An earlier sweep of this directory, dead, that this one resumes: the lock is another's.
    assert process_died({**tags, PID_TAG: "999999999"})

    gone = tmp_path / "gone"  # a sweep whose directory was removed: only its pid is left to ask
    dead = {**process_tags(), PID_TAG: "999999999", "ghsweep.sweep_dir": str(gone)}
    assert live_holder(gone) is None
    assert process_died(dead)
    assert not process_died({**dead, PID_NS_TAG: "pid:[1]"}), "a pid of another namespace was taken for dead"

    ended = tmp_path / "ended"  # its process held the lock and ended
    ended.mkdir()
    (ended / ".ghsweep.lock").write_text(identity(dead))
    assert live_holder(ended) == NOBODY and process_died({**dead, "ghsweep.sweep_dir": str(ended)})
    assert not process_died({**dead, "ghsweep.host": socket.gethostname() + "-elsewhere"})


def test_a_sweep_stopped_as_it_starts_is_started_again_by_the_same_command(tmp_path):
    # Stopped twice before its first job, then the same command once, to its end.
    # SIGTERM while it waits to create its MLflow run (the store locked by another tool).
    store = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
    store.execute("BEGIN EXCLUSIVE")
    proc = start_cli([*ONE_RUN, "hydra.sweep.dir=stopped"], tmp_path)
    deadline = time.monotonic() + 60
    while proc.poll() is None and not (tmp_path / "stopped" / ".ghsweep.lock").exists():
        assert time.monotonic() < deadline, "the sweep never claimed its directory"
        time.sleep(0.1)
    time.sleep(1)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    store.rollback()
    assert proc.returncode != 0 and not list((tmp_path / "stopped").glob("*/result.json"))
    assert_one_line_errors(stdout, stderr)

    # Killed outright once its MLflow run is made, before its manifest is written: a trigger holds it in
    # its first write after that run (the sweep's overrides).
    MlflowStore(sqlite_uri(tmp_path), "ghsweep")
    store.execute("CREATE TABLE spin (n INTEGER)")
    store.executemany("INSERT INTO spin VALUES (?)", [(n,) for n in range(400)])
    store.execute(
        "CREATE TRIGGER hold AFTER INSERT ON params WHEN NEW.key = 'sweep.overrides' "
        "BEGIN SELECT count(*) FROM spin a, spin b, spin c; END"
    )
    proc = start_cli([*ONE_RUN, "hydra.sweep.dir=stopped"], tmp_path)
    deadline = time.monotonic() + 120
    while store.execute("SELECT count(*) FROM runs").fetchone()[0] == 0:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.kill()
    proc.communicate(timeout=60)
    store.execute("DROP TRIGGER hold")
    store.close()
    assert not (tmp_path / "stopped" / "ghsweep_sweep.json").exists(), "killed too late: the manifest was written"
    assert [r.status for r in all_runs(sqlite_uri(tmp_path))] == ["RUNNING"]

    again = run_cli([*ONE_RUN, "hydra.sweep.dir=stopped"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert_one_line_errors(again.stdout, again.stderr)
    assert "1 of 1 runs finished" in again.stdout
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    killed = [p for p in by_role(runs, "sweep") if p.status == "FAILED"]
    assert len(killed) == 1 and killed[0].error.startswith("the sweep process died (pid ")


def test_status_records_a_run_whose_record_was_cut_by_a_kill_and_lists_past_an_unreadable_sweep(tmp_path):
    sweep_dir = Path("multirun", "2026-01-02", "10-00-00")
    sweep = run_cli([*ONE_RUN, f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    runs = all_runs(sqlite_uri(tmp_path))
    [parent], [child] = by_role(runs, "sweep"), by_role(runs, "run")
    # As a kill -9 of the sweep while it recorded the finished run leaves them: result.json FINISHED,
    # the run and the sweep RUNNING in MLflow, the run's metrics not all there.
    client = MlflowClient(sqlite_uri(tmp_path))
    for run in (parent, child):
        client.update_run(run.run_id, status="RUNNING")
    client.delete_tag(child.run_id, "ghsweep.status")
    (tmp_path / sweep_dir / "ghsweep_end.json").unlink()  # written as the sweep's end: a kill -9 leaves none
    proc = subprocess.run(
        [sys.executable, "-m", "ghsweep.status", str(sweep_dir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert "1 of 1 runs finished" in proc.stdout and "recorded FINISHED in MLflow from its run directory" in proc.stderr
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    [child] = by_role(runs, "run")
    assert child.status == "FINISHED" and child.tags["ghsweep.status"] == "FINISHED" and "tokens_per_s" in child.metrics

    # The listing: a sweep stopped as it started (an empty manifest) is one line, the others listed.
    empty = tmp_path / "multirun" / "2026-01-02" / "11-00-00"
    empty.mkdir(parents=True)
    (empty / "ghsweep_sweep.json").write_text("")
    listing = subprocess.run(
        [sys.executable, "-m", "ghsweep.status"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert listing.returncode == 0, listing.stderr
    assert_one_line_errors(listing.stdout, listing.stderr)
    lines = listing.stdout.splitlines()
    assert any(line.startswith(f"  {sweep_dir}  (local: python -m ghsweep -m") for line in lines), lines
    assert (
        f"  {Path(empty.relative_to(tmp_path))}  (skipped: " in listing.stdout
        and "empty or cut short" in listing.stdout
    )
