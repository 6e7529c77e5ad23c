"""Run identity and resume with the default (in-process) launcher; SLURM resume is in test_slurm.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ghsweep.core.run_dir import RESULT
from ghsweep.core.run_result import RunStatus
from ghsweep.launch.resume import run_hash, skip_finished
from ghsweep.tracking.mlflow_store import StoredRun
from tests.support.cli import run_cli
from tests.support.compose import compose_config
from tests.support.mlflow_records import MlflowRecords, sqlite_uri
from tests.support.paths import REPO


@pytest.mark.cli  # run_hash asks git for the checkout's commit
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
    assert f"skipped, already FINISHED in MLflow run {done.info.run_id} with the same config, code (ghsweep " in (
        second.stdout
    )
    assert "1 of 1 runs finished; 1 reused from earlier runs (#0; force=true reruns them)" in second.stdout
    # The row's reason, in the sweep's summary (the terminal shows one table: the comparison's).
    assert (
        f"reused: FINISHED earlier as MLflow run {done.info.run_id}" in (tmp_path / "again" / "summary.md").read_text()
    )
    assert len(records.runs("run")) == 1
    result = json.loads((tmp_path / "again" / "0" / "result.json").read_text())
    assert result["status"] == "FINISHED" and result["mlflow_run_id"] == done.info.run_id
    assert result["metrics"]["final_loss"] == done.data.metrics["final_loss"]
    # Where the first run's time went comes back as its timing, not as measurements.
    timing = {"startup_s", "setup_s", "model_s", "train_s", "capture_s"}
    timing |= {"worker_exit_s", "analysis_s", "record_s", "wall_s"}
    assert timing <= set(result["timing"]) and not timing & set(result["metrics"])
    assert not (tmp_path / "again" / "0" / "worker.log").exists()

    forced = run_cli([*args, "force=true", "hydra.sweep.dir=forced"], tmp_path)
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert len(records.runs("run")) == 2 and (tmp_path / "forced" / "0" / "worker.log").exists()
    assert "reused" not in forced.stdout


def git(checkout: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(checkout), *args],
        check=True,
        capture_output=True,
    )


def test_a_code_change_trains_again_and_a_reuse_names_code_and_data(tmp_path):
    """ghsweep run from a git checkout of its own: the same sweep reuses its run, naming the commit and
    the data file's digest; once the package is edited the same sweep trains again."""
    checkout = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__")
    for part in ("ghsweep", "hydra_plugins", "conf", "experiments", "launchers"):
        shutil.copytree(REPO / part, checkout / part, symlinks=True, ignore=ignore)
    git(checkout, "init", "-q")
    git(checkout, "add", ".")
    git(checkout, "commit", "-qm", "the code the runs ran")
    data = tmp_path / "dolly.jsonl"
    data.write_text(
        "".join(
            json.dumps({"instruction": f"q{i}", "context": "", "response": "a" * 40, "category": "qa"}) + "\n"
            for i in range(64)
        )
    )
    env = {"PYTHONPATH": str(checkout), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    args = ["-m", "experiment=smoke", "precision=fp32", "train.max_steps=2", "data=dolly_file", f"data.path={data}"]

    first = run_cli([*args, "hydra.sweep.dir=first"], tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_cli([*args, "hydra.sweep.dir=again"], tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    records = MlflowRecords(sqlite_uri(tmp_path))
    (done,) = records.runs("run")
    code = done.data.tags["ghsweep.code"]
    assert code.startswith("ghsweep ") and " commit " in code and "+dirty" not in code
    digest = json.loads(done.data.tags["ghsweep.inputs"])["data.path"]
    assert f"with the same config, code ({code}) and input files (data.path {digest[:19]})" in again.stdout

    with (checkout / "ghsweep" / "train" / "dolly_data.py").open("a") as source:
        source.write("# an edit: what training computes may have changed\n")
    edited = run_cli([*args, "hydra.sweep.dir=edited"], tmp_path, env=env)
    assert edited.returncode == 0, edited.stderr[-3000:]
    assert "reused" not in edited.stdout and (tmp_path / "edited" / "0" / "worker.log").exists()
    [new] = [r for r in records.runs("run") if r.info.run_id != done.info.run_id]
    assert new.data.tags["ghsweep.code"].startswith(f"{code}+dirty.")


def test_a_reused_result_is_not_written_through_a_run_directory_that_is_a_link(tmp_path, caplog):
    # A SLURM sweep's resume reuses a finished run before any job starts; its run directory planted as a
    # link to a folder elsewhere must not receive the result.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "sweep").mkdir()
    linked = tmp_path / "sweep" / "0"
    linked.symlink_to(elsewhere, target_is_directory=True)
    earlier = StoredRun(
        "r1", "precision=bf16", "FINISHED", "1", 0, {"ghsweep.run_dir": str(linked)}, {}, {"tokens_per_s": 5.0}
    )
    result = skip_finished(earlier, "precision=bf16", linked, ["precision=bf16"])
    assert result.reused and result.status == RunStatus.FINISHED and result.metrics == {"tokens_per_s": 5.0}
    assert list(elsewhere.iterdir()) == []
    assert "is a symbolic link; its result.json is not written" in caplog.text
    plain = tmp_path / "sweep" / "1"
    skip_finished(earlier, "precision=bf16", plain, ["precision=bf16"])
    assert json.loads((plain / RESULT).read_text())["reused"] is True
