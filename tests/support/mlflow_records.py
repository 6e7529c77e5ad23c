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


def assert_two_runs_per_gpu_one_at_a_time(runs: list, gpu_tag: str) -> None:
    """Four runs of a sweep placed on two GPUs (MLflow runs, `gpu_tag` naming each one's GPU): two on
    each, and the second on a GPU started after the first on it ended."""
    by_gpu: dict[str, list] = {}
    for run in runs:
        by_gpu.setdefault(run.data.tags[gpu_tag], []).append(run)
    assert sorted(len(r) for r in by_gpu.values()) == [2, 2], {g: len(r) for g, r in by_gpu.items()}
    for first, second in (sorted(r, key=lambda r: r.info.start_time) for r in by_gpu.values()):
        assert second.info.start_time > first.info.end_time
