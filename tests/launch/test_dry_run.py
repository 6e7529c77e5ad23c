"""`dry_run=true` through the real CLI: every combination's run directory, worker command and
SLURM parameters are printed, and nothing runs, is submitted or is recorded."""

from __future__ import annotations

import re

from tests.conftest import run_cli


def blocks(stdout: str) -> list[list[str]]:
    """The printed combinations: a `#N name` line followed by its indented lines."""
    found: list[list[str]] = []
    for line in stdout.splitlines():
        if re.match(r"^#\d+ ", line):
            found.append([line])
        elif found and line.startswith("  ") and len(found[-1]) < 5:
            found[-1].append(line)
    return found


def assert_nothing_ran(cwd) -> None:
    assert not (cwd / "mlflow.db").exists()
    assert not list(cwd.rglob(".submitit"))
    assert not list(cwd.rglob("worker.log")) and not list(cwd.rglob("ghsweep_jobs.json"))


def test_slurm_sweep_dry_run_prints_every_combination_and_submits_nothing(tmp_path):
    proc = run_cli(["-m", "hydra/launcher=local_slurm", "experiment=smoke", "precision=fp32,bf16",
                    "offload=off,on", "dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = blocks(proc.stdout)
    assert len(found) == 4
    run_dirs = set()
    for i, block in enumerate(found):
        head, run_dir, worker, launch = block[:4]
        assert head.startswith(f"#{i} ")
        run_dirs.add(run_dir.split("run dir: ")[1])
        assert worker.endswith(f"-m ghsweep.train.worker {run_dir.split('run dir: ')[1]}")
        for option in ("--array=0-3%4", "--cpus-per-task=1", "--gpus-per-node=1", "--mem=2GB",
                       "--partition=debug", "--time=10", "--signal=USR2@120"):
            assert option in launch.split(), option
    assert len(run_dirs) == 4
    assert "dry run, 4 combinations; nothing was submitted" in proc.stdout
    assert_nothing_ran(tmp_path)


def test_gh200_dry_run_shows_the_container_command(tmp_path):
    image = tmp_path / "ghsweep-nemo.sif"
    proc = run_cli(["-m", "hydra/launcher=gh200", "experiment=smoke", "precision=fp32", f"container.image={image}",
                    "hydra.launcher.partition=gh", "hydra.launcher.account=proj1", "dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ((_, run_dir, worker, launch),) = [b[:4] for b in blocks(proc.stdout)]
    run_dir = run_dir.split("run dir: ")[1]
    assert worker.split("worker:  ")[1].startswith(f"singularity exec --nv --bind {run_dir} ")
    assert f" {image} python3 -m ghsweep.train.worker {run_dir}" in worker
    for option in ("--gpus-per-node=1", "--cpus-per-task=72", "--mem=400GB", "--time=120", "--partition=gh",
                   "--account=proj1"):
        assert option in launch.split(), option
    assert_nothing_ran(tmp_path)


def test_local_dry_run_prints_and_trains_nothing(tmp_path):
    proc = run_cli(["experiment=smoke", "dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ((head, run_dir, worker, launch),) = [b[:4] for b in blocks(proc.stdout)]
    assert "-m ghsweep.train.worker" in worker and "launch:  in this process (hydra/launcher=local)" in launch
    assert_nothing_ran(tmp_path)


def test_wait_false_needs_a_slurm_launcher(tmp_path):
    proc = run_cli(["-m", "experiment=smoke", "wait=false"], tmp_path)
    assert proc.returncode != 0
    assert "wait=false: needs a SLURM launcher profile (e.g. hydra/launcher=gh200); this sweep uses " \
           "hydra/launcher=local" in proc.stderr
    assert_nothing_ran(tmp_path)
