"""hydra/launcher=submitit_local: the combinations run as parallel submitit jobs on this machine."""

from __future__ import annotations

import stat

from ghsweep.launch.slurm.submitted_jobs import load_jobs
from tests.support.cli import run_cli
from tests.support.mlflow_records import MlflowRecords, assert_two_runs_per_gpu_one_at_a_time, sqlite_uri


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


def test_a_sweep_on_gpus_gives_each_combination_gpus_of_its_own(tmp_path):
    # Stand-in GPUs on a machine without any: each job is given one by CUDA_VISIBLE_DEVICES as on a GPU
    # machine (its worker then finds no CUDA and trains on the CPU).
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=submitit_local",
            "experiment=smoke",
            "precision=fp32",
            "peft=lora,none",
            "repeat=1,2",
            "train.max_steps=2",
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
        env={"CUDA_VISIBLE_DEVICES": "3,5"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert len(load_jobs(tmp_path / "sweep")) == 4
    runs = MlflowRecords(sqlite_uri(tmp_path)).runs("run")
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert_two_runs_per_gpu_one_at_a_time(runs, "ghsweep.cuda_visible_devices")
    assert {r.data.tags["ghsweep.cuda_visible_devices"] for r in runs} == {"3", "5"}
    assert proc.stdout.count("started on GPU 3") == 2 and proc.stdout.count("started on GPU 5") == 2


def test_a_combination_on_two_gpus_waits_until_both_are_free(tmp_path):
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=submitit_local",
            "experiment=smoke",
            "precision=fp32",
            "backend.gpus_per_node=1,2",
            "train.max_steps=2",
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
        env={"CUDA_VISIBLE_DEVICES": "0,1"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    runs = {r.data.params["backend.gpus_per_node"]: r for r in MlflowRecords(sqlite_uri(tmp_path)).runs("run")}
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    assert runs["1"].data.tags["ghsweep.cuda_visible_devices"] == "0"
    assert runs["2"].data.tags["ghsweep.cuda_visible_devices"] == "0,1"
    # GPU 1 was free at once, but the two-GPU combination needs GPU 0 too.
    assert runs["2"].info.start_time > runs["1"].info.end_time


def test_a_dry_run_says_which_gpus_the_combinations_are_placed_on(tmp_path):
    proc = run_cli(
        ["-m", "hydra/launcher=submitit_local", "experiment=smoke", "backend.gpus_per_node=1,2", "dry_run=true"],
        tmp_path,
        env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    placed = [line.split("; ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("  launch:")]
    assert placed == [
        "on GPUs of its own (its job's CUDA_VISIBLE_DEVICES): 0 or 1 or 2 or 3, one combination per set at once",
        "on GPUs of its own (its job's CUDA_VISIBLE_DEVICES): 0,1 or 2,3, one combination per set at once",
    ]
    # Hydra's notice that the profile shares the plugin's schema name is nothing a user can act on.
    assert "ConfigStore schema" not in proc.stderr


def test_a_combination_needing_more_gpus_than_the_sweep_has_is_refused_first(tmp_path):
    proc = run_cli(
        ["-m", "hydra/launcher=submitit_local", "experiment=smoke", "precision=fp32", "backend.gpus_per_node=1,2"],
        tmp_path,
        env={"CUDA_VISIBLE_DEVICES": "3"},
    )
    assert proc.returncode == 1
    assert (
        "#1 backend.gpus_per_node=2,experiment=smoke,precision=fp32: backend.gpus_per_node=2: needs 2 GPUs and "
        "the sweep has GPUs [3] (CUDA_VISIBLE_DEVICES); accepted: backend.gpus_per_node <= 1, or more GPUs"
    ) in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists()
