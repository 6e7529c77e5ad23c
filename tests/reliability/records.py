"""What a sweep left behind, read back from MLflow and the run directories, for the reliability tests."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.entities import Run
from mlflow.tracking import MlflowClient


def sqlite_uri(cwd: Path) -> str:
    return f"sqlite:///{cwd / 'mlflow.db'}"


def all_runs(uri: str, experiment: str = "ghsweep") -> list[Run]:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], max_results=10000) if exp else []


def by_role(runs: list[Run], role: str) -> list[Run]:
    return [r for r in runs if r.data.tags.get("ghsweep.role") == role]


def assert_nothing_running(runs: list[Run]) -> None:
    running = [r.info.run_name for r in runs if r.info.status == "RUNNING"]
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
