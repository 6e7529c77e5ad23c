"""Links planted in a running sweep's directory: files the sweep writes replace a link, never write
through it, and a run directory that is a link is refused (that run FAILED, the rest go on)."""

from __future__ import annotations

from tests.support.cli import assert_one_line_errors, start_cli
from tests.support.mlflow_records import all_runs, assert_nothing_running, by_role, sqlite_uri
from tests.support.stopped_sweep import wait_until_training

SWEEP = ["-m", "experiment=smoke", "precision=fp32", "train.max_steps=40,3,4", "train.seq_length=64"]


def test_links_planted_in_a_sweep_directory_are_replaced_and_a_linked_run_directory_refused(tmp_path):
    victim = tmp_path / "victim"
    (victim / "rundir").mkdir(parents=True)
    for name in ("summary.md", "comparison.md", "overrides.yaml", "worker.log", "worker.pid"):
        (victim / name).write_text("not the sweep's")
    proc = start_cli([*SWEEP, "train.log_every=1", "hydra.sweep.dir=sweep"], tmp_path)
    sweep = tmp_path / "sweep"
    wait_until_training(sweep / "0", proc, max_steps=40)
    (sweep / "summary.md").symlink_to(victim / "summary.md")
    (sweep / "comparison").mkdir()
    (sweep / "comparison" / "comparison.md").symlink_to(victim / "comparison.md")
    (sweep / "1").symlink_to(victim / "rundir", target_is_directory=True)
    (sweep / "2").mkdir()
    for name in ("overrides.yaml", "worker.log", "worker.pid"):
        (sweep / "2" / name).symlink_to(victim / name)
    stdout, stderr = proc.communicate(timeout=600)

    assert proc.returncode == 1, stderr[-3000:]
    assert_one_line_errors(stdout, stderr)
    assert "2 of 3 runs finished" in stdout, stdout[-3000:]
    assert all(p.read_text() == "not the sweep's" for p in victim.iterdir() if p.is_file())
    assert list((victim / "rundir").iterdir()) == []
    assert not (sweep / "summary.md").is_symlink() and "```" in (sweep / "summary.md").read_text()
    assert not any((sweep / "2" / name).is_symlink() for name in ("overrides.yaml", "worker.log", "worker.pid"))
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    children = {c.job_num: c for c in by_role(runs, "run")}
    assert {n: c.status for n, c in children.items()} == {0: "FINISHED", 1: "FAILED", 2: "FINISHED"}
    assert children[1].error == (
        f"the run directory {sweep / '1'} is a symbolic link (to {victim / 'rundir'}); a sweep writes only "
        "into directories it makes: remove the link"
    )
