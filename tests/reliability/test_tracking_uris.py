"""A tracking URI that cannot work fails in seconds, before any job, with one line that says what to
do; the tracking-server wrapper stops its server on SIGTERM as on Ctrl-C."""

from __future__ import annotations

import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from ghsweep.tracking.mlflow_store import check_tracking_uri
from tests.support.cli import assert_one_line_errors, run_cli
from tests.support.paths import REPO
from tests.support.ports import free_port

START_HINT = "start one with `python -m ghsweep.tracking.server --port {port}`, or pass tracking=sqlite"


@pytest.mark.parametrize("mode", [["-m", "precision=fp32,bf16"], ["precision=fp32"]], ids=["sweep", "single run"])
def test_no_server_at_the_uri_fails_in_seconds_before_any_job(tmp_path, mode):
    port = free_port()  # nothing listens there
    started = time.monotonic()
    proc = run_cli([*mode, "experiment=smoke", "tracking=server", f"tracking.uri=http://127.0.0.1:{port}"], tmp_path)
    took = time.monotonic() - started
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"ghsweep: tracking.uri=http://127.0.0.1:{port}: no tracking server there (connection refused); "
        + START_HINT.format(port=port)
        + " to log to ./mlflow.db"
    )
    assert_one_line_errors(proc.stdout, proc.stderr)
    # MLflow's own HTTP retries took minutes here; the check answers before them.
    assert took < 60, f"took {took:.0f} s"
    assert not list(tmp_path.rglob("worker.log")) and not list(tmp_path.rglob("result.json"))
    assert not (tmp_path / "mlflow.db").exists()


NO_STORE = (
    "not a tracking URI MLflow can open; accepted: http://HOST:PORT or https://... (a tracking server), "
    "sqlite:///FILE, or a database URL (postgresql, mysql, mssql)"
)


@pytest.mark.parametrize("uri", ["htp://127.0.0.1:5000", "mlruns", "ftp://host/store"])
def test_a_uri_of_no_store_mlflow_knows_is_refused(uri):
    with pytest.raises(ValueError, match="^" + re.escape(f"tracking.uri={uri}: {NO_STORE}") + "$"):
        check_tracking_uri(uri)


def test_a_uri_of_no_store_mlflow_knows_is_one_line_from_the_cli(tmp_path):
    proc = run_cli(["-m", "experiment=smoke", "precision=fp32", "tracking.uri=mlruns"], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == f"ghsweep: tracking.uri=mlruns: {NO_STORE}"
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert not list(tmp_path.rglob("result.json"))


def test_an_unknown_host_is_one_line_too():
    with pytest.raises(
        ValueError,
        match=r"^tracking.uri=http://no-such-host.invalid:5000: cannot connect to "
        r"no-such-host.invalid:5000 \(.+\); check the address, or pass tracking=sqlite$",
    ):
        check_tracking_uri("http://no-such-host.invalid:5000")


def test_a_listening_server_and_sqlite_pass_the_check(mlflow_server, tmp_path):
    check_tracking_uri(mlflow_server.url)
    check_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")


def _refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_server_wrapper_stops_its_server_on_sigterm_as_on_ctrl_c(tmp_path, stop):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "ghsweep.tracking.server", "--root", str(tmp_path / "server"), "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Started with SIGINT ignored, as a background job of a script is (and as this test's process may
        # be after another test): Ctrl-C must still stop it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        first_line = wrapper.stdout.readline()
        assert first_line.startswith(f"MLflow tracking server at http://127.0.0.1:{port}"), first_line
        assert not _refuses(port)
        wrapper.send_signal(stop)
        assert wrapper.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while not _refuses(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _refuses(port), "the mlflow server outlived its wrapper"
    finally:
        wrapper.kill()


@pytest.fixture()
def plain_http_port():
    """A plain-HTTP server on 127.0.0.1 (it answers any request with 404)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture()
def silent_port():
    """A socket on 127.0.0.1 that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


CANNOT_ANSWER = [
    ("https", "plain_http_port", "no TLS at 127.0.0.1:{port} ({why}); a plain-HTTP server takes http://"),
    ("http", "silent_port", "127.0.0.1:{port} accepts connections but sent no answer within 20 s"),
    ("https", "silent_port", "127.0.0.1:{port} accepts connections but sent no answer within 20 s"),
]


@pytest.mark.parametrize(
    "scheme, server, message", CANNOT_ANSWER, ids=["https at plain http", "http never answers", "https never answers"]
)
def test_a_server_that_cannot_answer_is_refused_in_seconds(request, scheme, server, message):
    port = request.getfixturevalue(server)
    uri = f"{scheme}://127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(ValueError) as refused:
        check_tracking_uri(uri)
    took = time.monotonic() - started
    expected = f"tracking.uri={uri}: " + message.format(port=port, why="WRONG_VERSION_NUMBER")
    assert str(refused.value).startswith(expected) and "\n" not in str(refused.value), refused.value
    # MLflow's own retries ran 255 s (TLS) and over 600 s (no answer) before this check.
    assert took < 40, f"took {took:.0f} s"


def test_a_server_that_never_answers_is_one_line_from_the_cli(tmp_path, silent_port):
    uri = f"http://127.0.0.1:{silent_port}"
    started = time.monotonic()
    proc = run_cli(
        ["-m", "experiment=smoke", "precision=fp32,bf16", "tracking=server", f"tracking.uri={uri}"], tmp_path
    )
    took = time.monotonic() - started
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ghsweep: tracking.uri={uri}: " + CANNOT_ANSWER[1][2].format(port=silent_port)), last
    assert_one_line_errors(proc.stdout, proc.stderr)
    # The check itself takes seconds, but the CLI's start can take two minutes on a loaded 2-core machine.
    assert took < 200, f"took {took:.0f} s"
    assert not list(tmp_path.rglob("worker.log")) and not (tmp_path / "mlflow.db").exists()


class _HealthyButBroken(http.server.BaseHTTPRequestHandler):
    """A tracking server whose database is down: /health answers, every API call fails (500), or its
    connection is closed unanswered (`closes`)."""

    closes = False

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")
        elif self.closes:
            self.close_connection = True
        else:
            self.send_error(500)

    def log_message(self, *args: object) -> None:  # quiet: the test reads the error line, not the server log
        pass


class _HealthyButClosing(_HealthyButBroken):
    closes = True


@pytest.mark.parametrize(
    "handler, message",
    [
        (_HealthyButBroken, "the server answers /health but fails its API (HTTP 500 Internal Server Error)"),
        (_HealthyButClosing, "did not answer HTTP (RemoteDisconnected"),
    ],
    ids=["500 on every call", "closes every call"],
)
def test_a_server_that_answers_health_but_cannot_record_is_refused_in_seconds(handler, message):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    started = time.monotonic()
    try:
        with pytest.raises(ValueError, match=r"^tracking.uri=http://127.0.0.1:\d+: .*") as refused:
            check_tracking_uri(uri)
    finally:
        server.shutdown()
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert time.monotonic() - started < 10
