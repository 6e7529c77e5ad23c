"""Start a local MLflow tracking server for sweeps whose jobs run on other nodes.

    python -m ghsweep.tracking.server --root mlruns-server --port 5000

serves `http://127.0.0.1:5000` (loopback unless `--host` says otherwise) with a SQLite store and
artifacts under ROOT; point jobs at it with `tracking=server tracking.uri=http://HOST:PORT`.
MLflow's job runner is switched off: it costs ~2.5 GB and 20-40 s of start-up and sweeps never use it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TrackingServer:
    process: subprocess.Popen
    url: str
    log_path: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def server_command(root: Path, host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{root.resolve() / 'mlflow.db'}",
        "--artifacts-destination",
        str((root / "artifacts").resolve()),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def start_server(root: Path, host: str = "127.0.0.1", port: int = 5000, timeout_s: float = 120) -> TrackingServer:
    """Start `mlflow server` in its own process group and wait until /health answers."""
    root.mkdir(parents=True, exist_ok=True)
    log_path = root / "server.log"
    # NullPool: a connection per request. SQLite serialises the writes itself (MLflow sets a 20 s busy
    # timeout); SQLAlchemy's default pool (5 + 10) made the 16th concurrent job wait 30 s and fail.
    env = {
        "MLFLOW_SQLALCHEMYSTORE_POOLCLASS": "NullPool",
        **os.environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            server_command(root, host, port), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = TrackingServer(process, f"http://{host}:{port}", log_path)
    try:
        _wait_until_healthy(server, timeout_s)
    except BaseException:  # also Ctrl-C or SIGTERM while waiting: no server left behind
        server.stop()
        raise
    return server


def _wait_until_healthy(server: TrackingServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"mlflow server exited with status {server.process.returncode}; see {server.log_path}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(
        f"mlflow server at {server.url} did not answer /health within {timeout_s} s; see {server.log_path}"
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ghsweep.tracking.server", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("mlflow-server"), help="store and artifacts folder")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args(argv)
    # Process managers, `timeout` and `kill` stop with SIGTERM: it must stop the server too, as Ctrl-C does.
    # SIGINT too where the wrapper started with it ignored (a background job of a non-interactive shell,
    # a child of a process that ignores it): Python installs its Ctrl-C handler only where it was not.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        server = start_server(args.root, args.host, args.port)
    except KeyboardInterrupt:  # start_server stopped what it had started
        return 130
    try:
        print(
            f"MLflow tracking server at {server.url} (store and artifacts in {args.root}); Ctrl-C or SIGTERM stops it",
            flush=True,
        )
        server.process.wait()
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
