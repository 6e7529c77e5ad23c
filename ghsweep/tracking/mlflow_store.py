"""MLflow records of sweeps and runs, through MlflowClient (no global active-run state).

Metrics go in batches (one request per 1000 points, not one per point): against a tracking
server, single calls cost tens of milliseconds each. Calls that fail because the server's database
is busy (many jobs logging at once to a SQLite-backed server) are retried with backoff, so a
finished run's record is not lost to a moment of contention.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from contextlib import contextmanager
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

# MLflow otherwise phones home at start-up; clusters' compute nodes often have no internet.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from ghsweep.tracking import redact  # noqa: E402
from ghsweep.core.errors import TrackingUriError

MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_TAGS_PER_BATCH = 100
MAX_PARAM_VALUE_CHARS = 6000

# What a tracking server answers when its database is momentarily overloaded; MLflow's own HTTP
# retries cover 429/5xx only, and these come back as 400 BAD_REQUEST.
TRANSIENT_ERROR_MARKERS = ("QueuePool limit", "database is locked", "connection timed out")
TRANSIENT_ERROR_CODES = ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED")
RETRY_DELAYS_S = (1, 2, 4, 8, 15, 30, 30, 30, 30, 30)

# Stores MLflow 3 opens: a tracking server, or a database through SQLAlchemy (dialect[+driver]://).
ACCEPTED_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql")
CONNECT_TIMEOUT_S = 5

log = logging.getLogger(__name__)


def check_tracking_uri(uri: str) -> None:
    """Fail in seconds on a URI that cannot work, instead of in minutes of MLflow's HTTP retries.

    A server that refuses the connection is not there (a busy one accepts and answers slowly, and
    its answers are retried by with_retry).
    """
    parts = urlsplit(uri)
    scheme = parts.scheme.split("+")[0]
    if scheme not in ACCEPTED_SCHEMES:
        raise TrackingUriError(
            f"tracking.uri={uri}: not a tracking URI MLflow can open; accepted: http://HOST:PORT or https://... "
            f"(a tracking server), sqlite:///FILE, or a database URL ({', '.join(ACCEPTED_SCHEMES[3:])})")
    if scheme not in ("http", "https"):
        return
    port = parts.port or (443 if scheme == "https" else 80)
    start_hint = (f"start one with `python -m ghsweep.tracking.server --port {port}`, "
                  "or pass tracking=sqlite to log to ./mlflow.db")
    try:
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except ConnectionRefusedError:
        raise TrackingUriError(f"tracking.uri={uri}: no tracking server there (connection refused); {start_hint}") from None
    except OSError as error:  # host not found, unreachable, no answer in time
        raise TrackingUriError(f"tracking.uri={uri}: cannot connect to {parts.hostname}:{port} "
                               f"({error.strerror or error}); check the address, or pass tracking=sqlite") from None


def is_transient(error: MlflowException) -> bool:
    """True for errors that say 'busy, try again', not 'this request is wrong'."""
    return error.error_code in TRANSIENT_ERROR_CODES or any(m in str(error) for m in TRANSIENT_ERROR_MARKERS)


def with_retry(call: Callable, *args, **kwargs):
    """Run one MLflow call, retrying transient server errors (about 3 minutes in all)."""
    for delay in RETRY_DELAYS_S:
        try:
            return call(*args, **kwargs)
        except MlflowException as error:
            if not is_transient(error):
                raise
            log.warning("tracking server busy (%s); retrying in %d s", str(error).splitlines()[0][:200], delay)
            time.sleep(delay)
    return call(*args, **kwargs)


def absolute_tracking_uri(uri: str, base_dir: str | Path) -> str:
    """Make a relative `sqlite:///file.db` absolute, so jobs that run elsewhere share one store."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str((Path(base_dir) / uri[len(prefix):]).resolve())
    return uri


def flatten(tree: Mapping, prefix: str = "") -> dict[str, str]:
    """{'peft': {'r': 16}} -> {'peft.r': '16'}; lists and None as their text."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = str(value)
    return flat


@contextmanager
def first_open_lock(uri: str):
    """Held while a SQLite store is opened: MLflow creates a new file's tables on first open, and two
    processes doing that at once fail ("table ... already exists"). A server needs no lock."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    path = Path(uri.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)  # a store named in a new folder gets the folder
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class MlflowStore:
    def __init__(self, tracking_uri: str, experiment: str):
        check_tracking_uri(tracking_uri)
        self.tracking_uri = tracking_uri
        with first_open_lock(tracking_uri):
            self.client = MlflowClient(tracking_uri=tracking_uri)
            self.experiment_id = self._experiment_id(experiment)

    def _experiment_id(self, name: str) -> str:
        found = with_retry(self.client.get_experiment_by_name, name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:
            # Another job created it between our look-up and our create.
            return with_retry(self.client.get_experiment_by_name, name).experiment_id

    # Names, params and tags pass through ghsweep.tracking.redact: no secret reaches the store.
    def start_run(self, run_name: str, tags: Mapping[str, str], parent_run_id: str | None = None) -> str:
        all_tags = {k: redact.text(str(v)) for k, v in tags.items()}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = with_retry(self.client.create_run, self.experiment_id, run_name=redact.run_name(run_name), tags=all_tags)
        return run.info.run_id

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        items = [Param(k, v[:MAX_PARAM_VALUE_CHARS]) for k, v in redact.params(params).items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            with_retry(self.client.log_batch, run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        items = [RunTag(k, redact.text(str(v))) for k, v in tags.items()]
        for i in range(0, len(items), MAX_TAGS_PER_BATCH):
            with_retry(self.client.log_batch, run_id, tags=items[i : i + MAX_TAGS_PER_BATCH])

    def log_metrics(self, run_id: str, points: Iterable[tuple[str, float, int]]) -> int:
        """Log (name, value, step) points in batches; returns how many were sent."""
        now_ms = int(time.time() * 1000)
        items = [Metric(name, float(value), now_ms, step) for name, value, step in points]
        for i in range(0, len(items), MAX_METRICS_PER_BATCH):
            with_retry(self.client.log_batch, run_id, metrics=items[i : i + MAX_METRICS_PER_BATCH])
        return len(items)

    def log_artifacts(self, run_id: str, paths: Iterable[Path], artifact_path: str | None = None) -> None:
        for path in paths:
            if path.exists():
                with_retry(self.client.log_artifact, run_id, str(path), artifact_path)

    def finish(self, run_id: str, status: str) -> None:
        with_retry(self.client.set_terminated, run_id, status=status)
