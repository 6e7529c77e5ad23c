"""What ghsweep recorded in MLflow, read back (with MLflow's own client, or ghsweep's store)."""

from __future__ import annotations

from pathlib import Path

from ghsweep.tracking.mlflow_store import MlflowStore, StoredRun


def sqlite_uri(cwd: Path) -> str:
    """The tracking URI of the MLflow store a CLI run in `cwd` writes by default (./mlflow.db)."""
    return f"sqlite:///{cwd / 'mlflow.db'}"


class MlflowRecords:
    """What ghsweep recorded in one MLflow experiment, read back with MLflow's own client."""

    def __init__(self, tracking_uri: str, experiment: str = "ghsweep"):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment_id = self.client.get_experiment_by_name(experiment).experiment_id

    def runs(self, role: str) -> list:
        """The runs tagged `ghsweep.role` = `role`: "sweep" (a sweep's parent) or "run" (one combination)."""
        return self.client.search_runs([self.experiment_id], filter_string=f"tags.`ghsweep.role` = '{role}'")


def all_runs(uri: str, experiment: str = "ghsweep") -> list[StoredRun]:
    return MlflowStore(uri, experiment).search()


def by_role(runs: list[StoredRun], role: str) -> list[StoredRun]:
    return [r for r in runs if r.role == role]


def assert_nothing_running(runs: list[StoredRun]) -> None:
    running = [r.name for r in runs if r.status == "RUNNING"]
    assert not running, f"left RUNNING: {running}"
