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


def test_tracking_server_gone_mid_run_loses_nothing_on_disk(tmp_path):
    """The server dies while the run trains: the job says so, and the run directory keeps the whole
    record (result, report, metrics), so nothing the run measured is lost."""
    import json
    import os
    import subprocess
    import sys
    import time

    from ghsweep.tracking.server import start_server
    from tests.conftest import free_port

    server = start_server(tmp_path / "server", port=free_port())
    # No long HTTP retries against a server that is gone for good.
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
               MLFLOW_HTTP_REQUEST_TIMEOUT="5")
    proc = subprocess.Popen([sys.executable, "-m", "ghsweep", "experiment=smoke", "precision=fp32", "train.max_steps=40",
                             "tracking=server", f"tracking.uri={server.url}", "tracking.experiment=outage"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("outputs/*/*/worker.log")) and time.monotonic() < deadline:
            time.sleep(0.2)
        server.stop()
        out, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
        server.stop()
    assert "the MLflow record is incomplete; the run's record is complete in" in out, out[-3000:]
    run_dir = next(tmp_path.glob("outputs/*/*"))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "FINISHED" and result["metrics"]["tokens_per_s"] > 0, (result, out[-3000:])
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 40
    assert "FINISHED" in (run_dir / "report.md").read_text()
