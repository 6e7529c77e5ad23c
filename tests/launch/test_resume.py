"""Run identity and resume with the default (in-process) launcher; SLURM resume is in test_slurm.py."""

from __future__ import annotations

import json

from ghsweep.launch.resume import run_hash
from tests.support.cli import run_cli
from tests.support.compose import compose_config
from tests.support.mlflow_records import MlflowRecords, sqlite_uri


def test_hash_ignores_launch_and_tracking_keys_but_not_what_trains():
    base = run_hash(compose_config("experiment=smoke"))
    assert base == run_hash(
        compose_config(
            "experiment=smoke",
            "force=true",
            "dry_run=true",
            "wait=false",
            "tracking=server",
            "tracking.experiment=other",
            "hydra/launcher=local_slurm",
        )
    )
    assert base != run_hash(compose_config("experiment=smoke", "train.max_steps=7"))
    assert base != run_hash(compose_config("experiment=smoke", "precision=fp32"))
    assert base != run_hash(compose_config("experiment=smoke", "container.image=/c.sif"))


def test_same_sweep_again_skips_what_finished_and_force_reruns(tmp_path):
    args = ["-m", "experiment=smoke", "precision=fp32", "train.max_steps=2"]
    first = run_cli(args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    records = MlflowRecords(sqlite_uri(tmp_path))
    (done,) = records.runs("run")
    second = run_cli([*args, "hydra.sweep.dir=again"], tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"skipped, already FINISHED in MLflow run {done.info.run_id}" in second.stdout
    assert "1 of 1 runs finished; 1 reused from earlier runs (#0; force=true reruns them)" in second.stdout
    assert f"reused: FINISHED earlier as MLflow run {done.info.run_id}" in second.stdout  # the row's reason
    assert len(records.runs("run")) == 1
    result = json.loads((tmp_path / "again" / "0" / "result.json").read_text())
    assert result["status"] == "FINISHED" and result["mlflow_run_id"] == done.info.run_id
    assert result["metrics"]["final_loss"] == done.data.metrics["final_loss"]
    # Where the first run's time went comes back as its timing, not as measurements.
    timing = {"startup_s", "setup_s", "train_s", "capture_s", "worker_exit_s", "analysis_s", "record_s", "wall_s"}
    assert timing <= set(result["timing"]) and not timing & set(result["metrics"])
    assert not (tmp_path / "again" / "0" / "worker.log").exists()

    forced = run_cli([*args, "force=true", "hydra.sweep.dir=forced"], tmp_path)
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert len(records.runs("run")) == 2 and (tmp_path / "forced" / "0" / "worker.log").exists()
    assert "reused" not in forced.stdout
