"""A sweep logs to a real MLflow tracking server started by the project's helper."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from tests.conftest import run_cli


def test_server_binds_loopback_and_answers(mlflow_server):
    assert mlflow_server.url.startswith("http://127.0.0.1:")
    assert mlflow_server.process.poll() is None


def test_sweep_logs_to_server(mlflow_server, tmp_path):
    proc = run_cli(["-m", "experiment=smoke", "tracking=server", f"tracking.uri={mlflow_server.url}",
                    "tracking.experiment=server_test", "peft=lora,none", "precision=fp32", "train.max_steps=4"],
                   tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=mlflow_server.url)
    exp = client.get_experiment_by_name("server_test")
    children = client.search_runs([exp.experiment_id], filter_string="tags.`ghsweep.role` = 'run'")
    assert sorted(c.data.params["peft"] for c in children) == ["lora", "none"]
    for child in children:
        assert len(client.get_metric_history(child.info.run_id, "loss")) == 4
        assert "report.md" in {a.path for a in client.list_artifacts(child.info.run_id)}
    assert not (tmp_path / "mlflow.db").exists()
