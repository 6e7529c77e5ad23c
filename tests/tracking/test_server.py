"""A sweep logs to a real MLflow tracking server started by the project's helper."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from ghsweep.core.names import ROLE_RUN
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.support.cli import run_cli, start_cli


def listening_ipv4(port: int) -> set[str]:
    """The IPv4 addresses a socket of this machine listens on at `port` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def test_server_binds_loopback_and_answers(mlflow_server):
    port = urlsplit(mlflow_server.url).port
    assert listening_ipv4(port) == {"127.0.0.1"}
    # MLflow's REST API answers there: the experiment every store starts with.
    with urllib.request.urlopen(
        f"{mlflow_server.url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default", timeout=30
    ) as response:
        assert json.load(response)["experiment"]["experiment_id"] == "0"


def test_sweep_logs_to_server(mlflow_server, tmp_path):
    proc = run_cli(
        [
            "-m",
            "experiment=smoke",
            "tracking=server",
            f"tracking.uri={mlflow_server.url}",
            "tracking.experiment=server_test",
            "peft=lora,none",
            "precision=fp32",
            "train.max_steps=4",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = MlflowStore(mlflow_server.url, "server_test")
    children = store.search(role=ROLE_RUN)
    assert sorted(c.params["peft"] for c in children) == ["lora", "none"]
    for child in children:
        assert len(store.metric_history(child.run_id, "loss")) == 4
        assert "report.md" in store.artifact_paths(child.run_id)
    assert not (tmp_path / "mlflow.db").exists()


def test_tracking_server_gone_mid_run_loses_nothing_on_disk(tmp_path):
    """The server dies while the run trains: the job says so, and the run directory keeps the whole
    record (result, report, metrics), so nothing the run measured is lost."""
    import time

    from ghsweep.tracking.server import start_server
    from tests.support.ports import free_port

    server = start_server(tmp_path / "server", port=free_port())
    # No long HTTP retries against a server that is gone for good.
    env = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    proc = start_cli(
        [
            "experiment=smoke",
            "precision=fp32",
            "train.max_steps=40",
            "tracking=server",
            f"tracking.uri={server.url}",
            "tracking.experiment=outage",
        ],
        tmp_path,
        env=env,
        merge_stderr=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("outputs/*/*/worker.log")) and time.monotonic() < deadline:
            time.sleep(0.2)
        server.stop()
        out, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
        server.stop()
    assert "the MLflow record is incomplete (TrackingUriError: tracking.uri=" in out, out[-3000:]
    assert "; the run's record is complete in" in out and "Traceback" not in out, out[-3000:]
    run_dir = next(tmp_path.glob("outputs/*/*"))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "FINISHED" and result["metrics"]["tokens_per_s"] > 0, (result, out[-3000:])
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 40
    assert "FINISHED" in (run_dir / "report.md").read_text()
