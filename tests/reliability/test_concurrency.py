"""Sweeps side by side and runs that go wrong on the machine: two sweeps started at once in one
directory share ./mlflow.db and lose nothing; a sweep directory in use is refused; a full disk fails
only the run on it; a hanging worker is stopped by worker.timeout_min and recorded."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from ghsweep.config.schema import GPU_TIMEOUT_MIN
from ghsweep.config.validate import validate
from ghsweep.core.errors import ConfigError
from ghsweep.launch.worker_process import worker_timeout_min
from tests.support.cli import assert_one_line_errors, run_cli
from tests.support.compose import compose_config
from tests.support.mlflow_records import all_runs, assert_nothing_running, by_role, sqlite_uri
from tests.support.sweep_dirs import results

SHORT = ["-m", "experiment=smoke", "precision=fp32,bf16", "train.max_steps=2", "train.seq_length=64"]


def test_two_sweeps_started_at_once_share_the_store_and_lose_nothing(tmp_path):
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = list(pool.map(lambda n: run_cli([*SHORT, f"seed={n}", f"hydra.sweep.dir=sweep{n}"], tmp_path), (1, 2)))
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "database is locked" not in proc.stdout + proc.stderr
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    parents = by_role(runs, "sweep")
    assert sorted(p.status for p in parents) == ["FINISHED", "FINISHED"]
    for parent in parents:
        children = [c for c in by_role(runs, "run") if c.tags["mlflow.parentRunId"] == parent.run_id]
        assert sorted(c.params["precision"] for c in children) == ["bf16", "fp32"]
        assert all(c.status == "FINISHED" and "tokens_per_s" in c.metrics for c in children)
    assert sorted(r["status"] for n in (1, 2) for r in results(tmp_path / f"sweep{n}").values()) == ["FINISHED"] * 4


def test_a_sweep_directory_in_use_is_refused_with_one_line(tmp_path):
    first = run_cli([*SHORT[:2], "precision=fp32", "train.max_steps=2", "hydra.sweep.dir=shared"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_cli([*SHORT[:2], "precision=bf16", "train.max_steps=2", "hydra.sweep.dir=shared"], tmp_path)
    assert second.returncode == 1
    assert second.stderr.strip().splitlines()[-1] == (
        "ghsweep: hydra.sweep.dir=shared: already holds a sweep (ghsweep_sweep.json); start the sweep again (the "
        "default directory is named by the second) or set hydra.sweep.dir to a new directory"
    )
    assert_one_line_errors(second.stdout, second.stderr)
    runs = all_runs(sqlite_uri(tmp_path))
    assert len(runs) == 2 and results(tmp_path / "shared")[0]["status"] == "FINISHED"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs as a full disk needs root")
def test_a_full_disk_fails_only_the_run_on_it(tmp_path):
    full = tmp_path / "sweep" / "0"
    full.mkdir(parents=True)
    # Room for the run's small files, not for the PyTorch profiler's trace.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(full)], check=True)
    try:
        proc = run_cli(
            [
                "-m",
                "experiment=smoke",
                "precision=fp32,bf16",
                "train.max_steps=8",
                "profile=torch",
                "hydra.sweep.dir=sweep",
            ],
            tmp_path,
        )
    finally:
        subprocess.run(["umount", str(full)], check=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "ghsweep: 1 of 2 runs failed"
    reason = f"no space left on device under {full}"
    assert reason in proc.stdout
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    children = {c.params["precision"]: c for c in by_role(runs, "run")}
    assert children["fp32"].status == "FAILED" and children["fp32"].tags["ghsweep.error"].startswith(reason)
    assert children["bf16"].status == "FINISHED"


def test_a_hanging_worker_is_stopped_by_its_timeout_and_the_sweep_goes_on(tmp_path):
    # Each combination its own timeout (a config group of the test's): the run that must finish has
    # none, so a busy machine's slow worker start cannot time it out; the hanging one has 0.3 min.
    cases = tmp_path / "conf" / "case"
    cases.mkdir(parents=True)
    (cases / "hang.yaml").write_text("# @package _global_\ntrain: {max_steps: 100000}\nworker: {timeout_min: 0.3}\n")
    (cases / "finish.yaml").write_text("# @package _global_\ntrain: {max_steps: 2}\nworker: {timeout_min: null}\n")
    proc = run_cli(
        [
            "-m",
            "experiment=smoke",
            "precision=fp32",
            "+case=hang,finish",
            f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
            "train.seq_length=64",
        ],
        tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    reason = "worker timed out after 0.3 min (worker.timeout_min) and was killed"
    assert reason in proc.stdout
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    children = {c.params["train.max_steps"]: c for c in by_role(runs, "run")}
    assert children["100000"].status == "FAILED" and children["100000"].tags["ghsweep.error"] == reason
    assert children["2"].status == "FINISHED"


def test_the_worker_timeout_is_finite_on_a_gpu_by_default():
    assert worker_timeout_min("auto", on_gpu=True) == GPU_TIMEOUT_MIN == 60
    assert worker_timeout_min("auto", on_gpu=False) is None
    assert worker_timeout_min(None, on_gpu=True) is None
    assert worker_timeout_min(90, on_gpu=False) == 90
    for bad in ("soon", 0, -1, True):
        with pytest.raises(ConfigError, match=f"^worker.timeout_min={bad}: must be a number of minutes > 0"):
            validate(compose_config(f"worker.timeout_min={bad}".replace("True", "true")), gpu=None)
