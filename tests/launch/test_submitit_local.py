"""hydra/launcher=submitit_local: the combinations run as parallel submitit jobs on this machine."""

from __future__ import annotations

import stat

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
            # The sweep directory's permissions, as hydra-submitit-launcher sets them.
            "+hydra.sweep.mode=750",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert len(load_jobs(tmp_path / "sweep")) == 2
    assert stat.S_IMODE((tmp_path / "sweep").stat().st_mode) == 0o750
    records = MlflowRecords(sqlite_uri(tmp_path))
    (parent,) = records.runs("sweep")
    children = records.runs("run")
    assert sorted(c.data.params["peft"] for c in children) == ["lora", "none"]
    assert {c.info.status for c in children} == {"FINISHED"}
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert "2 of 2 runs finished" in proc.stdout
