"""The store goes away mid-sweep: a real `mlflow server` stopped and started again. The sweep goes on, every run's record is complete in its run directory, MLflow gets
what it can once it answers, and the sweep says in one line which runs are not in MLflow."""

from __future__ import annotations

import time

from ghsweep.tracking.mlflow_store import MlflowStore
from ghsweep.tracking.server import start_server
from tests.support.cli import assert_one_line_errors, start_cli
from tests.support.mlflow_records import assert_nothing_running, by_role
from tests.support.ports import free_port
from tests.support.stopped_sweep import wait_until_training
from tests.support.sweep_dirs import results

STEPS = 16
# Job 1 trains long enough for the store to go away under it; job 0 is short. Job 2 trains while the
# server starts again (seconds), as a forked worker starts at once: the sweep ends with the store back.
# Job 2 trains long enough (~20 s at 35 ms a step) for the stopped server to be started again before the
# sweep ends.
SWEEP = ["-m", "experiment=smoke", "precision=fp32", f"train.max_steps=2,{STEPS},600", "train.seq_length=64"]


def test_a_stopped_server_is_recorded_from_the_run_directories_when_it_is_back(tmp_path):
    port = free_port()
    server = start_server(tmp_path / "server", port=port)
    try:
        proc = start_cli(
            [*SWEEP, "hydra.sweep.dir=sweep", "train.log_every=1", "tracking=server", f"tracking.uri={server.url}"],
            tmp_path,
        )
        wait_until_training(tmp_path / "sweep" / "1", proc, max_steps=STEPS)
        server.stop()
        # Job 1 ends and records while the server is away; it is back before the sweep ends.
        deadline = time.monotonic() + 300
        while not (tmp_path / "sweep" / "2").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        # Back before the sweep ends; what it holds is read from it once the sweep has ended.
        server = start_server(tmp_path / "server", port=port)
        stdout, stderr = proc.communicate(timeout=600)
        assert_one_line_errors(stdout, stderr)
        on_disk = results(tmp_path / "sweep")
        assert [on_disk[n]["status"] for n in range(3)] == ["FINISHED"] * 3
        runs = MlflowStore(server.url, "ghsweep").search()
        assert_nothing_running(runs)
        children = {c.job_num: c for c in by_role(runs, "run")}
        missing = sorted(set(range(3)) - set(children))
        # Job 2 started while the server was away or back: either way its record is in the run directory,
        # and the one line names it when MLflow lacks it.
        if missing:
            assert proc.returncode == 1
            assert stderr.strip().splitlines()[-1].endswith(": " + ", ".join(map(str, missing)))
        else:
            assert proc.returncode == 0, stderr[-3000:]
        assert children[1].status == "FINISHED" and "tokens_per_s" in children[1].metrics  # from its files
        assert [p.status for p in by_role(runs, "sweep")] == ["FINISHED"]
    finally:
        server.stop()
