"""hydra/launcher=submitit_local: the combinations run as parallel submitit jobs on this machine."""

from __future__ import annotations

from ghsweep.launch.slurm_jobs import load_jobs
from tests.support.cli import run_cli
from tests.support.mlflow_records import MlflowRecords, sqlite_uri


def test_submitit_local_sweep_records_every_run(tmp_path):
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=submitit_local",
            "hydra.launcher.cpus_per_task=1",
            "experiment=smoke",
            "precision=fp32",
            "peft=lora,none",
            "train.max_steps=2",
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert len(load_jobs(tmp_path / "sweep")) == 2
    records = MlflowRecords(sqlite_uri(tmp_path))
    (parent,) = records.runs("sweep")
    children = records.runs("run")
    assert sorted(c.data.params["peft"] for c in children) == ["lora", "none"]
    assert {c.info.status for c in children} == {"FINISHED"}
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert "2 of 2 runs finished" in proc.stdout
