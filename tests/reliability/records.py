"""What a sweep left behind, read back from MLflow and the run directories, for the reliability tests."""

from __future__ import annotations

import json
from pathlib import Path

from ghsweep.tracking.mlflow_store import MlflowStore, StoredRun


def sqlite_uri(cwd: Path) -> str:
    return f"sqlite:///{cwd / 'mlflow.db'}"


def all_runs(uri: str, experiment: str = "ghsweep") -> list[StoredRun]:
    return MlflowStore(uri, experiment).search()


def by_role(runs: list[StoredRun], role: str) -> list[StoredRun]:
    return [r for r in runs if r.role == role]


def assert_nothing_running(runs: list[StoredRun]) -> None:
    running = [r.name for r in runs if r.status == "RUNNING"]
    assert not running, f"left RUNNING: {running}"


def results(sweep_dir: Path) -> dict[int, dict]:
    """result.json of each job, by job number."""
    return {int(p.parent.name): json.loads(p.read_text()) for p in sweep_dir.glob("*/result.json")}


def only_sweep_dir(cwd: Path) -> Path:
    found = [p.parent for p in cwd.glob("multirun/*/*/ghsweep_sweep.json")]
    assert len(found) == 1, found
    return found[0]


def assert_one_line_errors(stdout: str, stderr: str) -> None:
    """What a user sees of a failure: lines, never a Python traceback."""
    assert "Traceback" not in stdout + stderr, (stdout + stderr)[-3000:]
