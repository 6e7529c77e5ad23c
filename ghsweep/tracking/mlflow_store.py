"""MLflow records of sweeps and runs: the only module of ghsweep that talks to MLflow.

It owns how runs are kept and found: which tag marks a sweep's parent run and its combinations' runs,
how a run that ended badly says why, how runs are found again; what each record holds is
tracking/records.py's. Callers get StoredRun, not MLflow's types. It uses MlflowClient (no global
active-run state).

Metrics go in batches (one request per 1000 points, not one per point): against a tracking
server, single calls cost tens of milliseconds each. Calls that fail because the server's database
is busy (many jobs logging at once to a SQLite-backed server) are retried with backoff, so a
finished run's record is not lost to a moment of contention.
"""

from __future__ import annotations

import fcntl
import http.client
import logging
import os
import socket
import ssl
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ghsweep.core.errors import TrackingError, TrackingUriError, first_line
from ghsweep.core.names import (
    ERROR_TAG,
    EXPERIMENT_KIND_TAG,
    FAILURE_CLASS_TAG,
    JOB_NUM_TAG,
    MODEL_TRAINING_KIND,
    OVERRIDES_TAG,
    ROLE_RUN,
    ROLE_SWEEP,
    ROLE_TAG,
    RUN_DIR_TAG,
    STATUS_TAG,
    split_overrides,
)
from ghsweep.core.run_result import RunStatus
from ghsweep.tracking import redact
from ghsweep.tracking.empty_store import copy_empty_tables

MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_TAGS_PER_BATCH = 100
MAX_PARAM_VALUE_CHARS = 6000

# What a tracking server answers when its database is momentarily overloaded; MLflow's own HTTP
# retries cover 429/5xx only, and these come back as 400 BAD_REQUEST.
TRANSIENT_ERROR_MARKERS = ("QueuePool limit", "database is locked", "connection timed out")
TRANSIENT_ERROR_CODES = ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED")
# What SQLite says of a disk that is full or read-only, or of a database it cannot read: MLflow gives
# them the busy code, and no wait mends them.
LASTING_ERROR_MARKERS = ("database or disk is full", "readonly database", "disk I/O error", "unable to open database")
RETRY_DELAYS_S = (1, 2, 4, 8, 15, 30, 30, 30, 30, 30)
PARENT_TAG = "mlflow.parentRunId"
SEARCH_PAGE = 1000

# Stores MLflow 3 opens: a tracking server, or a database through SQLAlchemy (dialect[+driver]://).
ACCEPTED_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql")
CONNECT_TIMEOUT_S = 5
# A server that has taken the connection may still be slow to answer on a loaded host (a local server
# beside a sweep's compiles and a SLURM cluster on 2 cores once took more than 5 s); one silent for
# this long is stuck.
ANSWER_TIMEOUT_S = 20
# A read of the server's API that any working server answers (404 where the experiment is missing).
API_PROBE = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"

log = logging.getLogger(__name__)


def check_tracking_uri(uri: str) -> None:
    """Fail in seconds on a URI that cannot work, instead of in minutes of MLflow's HTTP retries.

    A server that refuses the connection is not there; one that accepts it must answer an HTTP request
    (any status: a proxy's 404 or 401 is an answer) within ANSWER_TIMEOUT_S, over TLS for https (the
    certificate is MLflow's to check, with its own settings). A busy server answers slowly, and its
    answers are retried by with_retry. Messages show the URI with its password redacted.
    """
    shown = redact.text(uri)
    parts = urlsplit(uri)
    scheme = parts.scheme.split("+")[0]
    if scheme not in ACCEPTED_SCHEMES:
        raise TrackingUriError(
            f"tracking.uri={shown}: not a tracking URI MLflow can open; accepted: http://HOST:PORT or https://... "
            f"(a tracking server), sqlite:///FILE, or a database URL ({', '.join(ACCEPTED_SCHEMES[3:])})"
        )
    if scheme not in ("http", "https"):
        return
    port = parts.port or (443 if scheme == "https" else 80)
    start_hint = (
        f"start one with `python -m ghsweep.tracking.server --port {port}`, "
        "or pass tracking=sqlite to log to ./mlflow.db"
    )
    host = parts.hostname or ""
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except ConnectionRefusedError:
        raise TrackingUriError(
            f"tracking.uri={shown}: no tracking server there (connection refused); {start_hint}"
        ) from None
    except OSError as error:  # host not found, unreachable, no answer in time
        raise TrackingUriError(
            f"tracking.uri={shown}: cannot connect to {host}:{port} "
            f"({error.strerror or error}); check the address, or pass tracking=sqlite"
        ) from None
    _check_answers(shown, scheme, host, port, parts.path)


def _check_answers(shown: str, scheme: str, host: str, port: int, path: str) -> None:
    """One request to the server's /health: an SSL handshake that fails or a server that never answers
    are one line now, where MLflow would retry them for minutes."""
    connection = (
        http.client.HTTPSConnection(host, port, timeout=ANSWER_TIMEOUT_S, context=ssl._create_unverified_context())
        if scheme == "https"
        else http.client.HTTPConnection(host, port, timeout=ANSWER_TIMEOUT_S)
    )
    try:
        connection.request("GET", path.rstrip("/") + "/health")
        connection.getresponse().read()
        # A server whose database is down answers /health and fails every call, which MLflow retries for minutes.
        connection.request("GET", path.rstrip("/") + API_PROBE)
        answer = connection.getresponse()
        answer.read()
        if answer.status >= 500:
            raise TrackingUriError(
                f"tracking.uri={shown}: the server answers /health but fails its API (HTTP {answer.status} "
                f"{answer.reason}); it cannot record runs: check its backend store (its database)"
            )
    except ssl.SSLError as error:
        raise TrackingUriError(
            f"tracking.uri={shown}: no TLS at {host}:{port} ({error.reason or error}); a plain-HTTP server "
            "takes http://, an https:// one needs TLS"
        ) from None
    except TimeoutError:
        raise TrackingUriError(
            f"tracking.uri={shown}: {host}:{port} accepts connections but sent no answer within "
            f"{ANSWER_TIMEOUT_S} s; check that a tracking server listens there"
        ) from None
    except (OSError, http.client.HTTPException) as error:
        raise TrackingUriError(
            f"tracking.uri={shown}: {host}:{port} did not answer HTTP ({type(error).__name__}: {error}); "
            "check that a tracking server listens there"
        ) from None
    finally:
        connection.close()


def is_transient(error: MlflowException) -> bool:
    """True for errors that say 'busy, try again', not 'this request is wrong'."""
    if any(m in str(error) for m in LASTING_ERROR_MARKERS):
        return False
    return error.error_code in TRANSIENT_ERROR_CODES or any(m in str(error) for m in TRANSIENT_ERROR_MARKERS)


def _said(error: MlflowException) -> str:
    """An MLflow error in one line: SQLite's own line where it names a disk that is full or read-only
    (MLflow's first line can be SQLAlchemy's note on when it flushed)."""
    lines = str(error).splitlines()
    lasting = [line.strip() for line in lines if any(m in line for m in LASTING_ERROR_MARKERS)]
    if lasting:
        return f"the store cannot write: {lasting[0]}"
    return first_line(error) or error.error_code


@dataclass(frozen=True)
class Retry:
    """Runs one MLflow call, retrying transient server errors after each delay in turn (about 3
    minutes in all with the default delays; `sleep` is how it waits); any other MLflow error is
    raised as TrackingError, so callers need not know MLflow's exceptions."""

    delays_s: tuple[float, ...] = RETRY_DELAYS_S
    sleep: Callable[[float], object] = time.sleep

    def __call__(self, call: Callable, *args: Any, **kwargs: Any) -> Any:
        for delay in (*self.delays_s, None):
            try:
                return call(*args, **kwargs)
            except MlflowException as error:
                if delay is None or not is_transient(error):
                    raise TrackingError(_said(error)) from error
                log.warning("tracking server busy (%s); retrying in %g s", first_line(error)[:200], delay)
                self.sleep(delay)


with_retry = Retry()


def absolute_tracking_uri(uri: str, base_dir: str | Path) -> str:
    """Make a relative `sqlite:///file.db` absolute, so jobs that run elsewhere share one store."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str((Path(base_dir) / uri[len(prefix) :]).resolve())
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
    """Held while a SQLite store is opened: a new file gets its tables on first open (copied,
    tracking.empty_store), and two processes doing that at once fail ("table ... already exists").
    A server needs no lock."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    path = Path(uri.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)  # a store named in a new folder gets the folder
    try:
        lock = open(f"{path}.lock", "a")  # noqa: SIM115 (closed below)
    except OSError:  # a read-only file system: no process makes tables there; its first write says why
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        copy_empty_tables(path)
        yield


@dataclass(frozen=True)
class StoredRun:
    """One run as the store holds it."""

    run_id: str
    name: str
    status: str  # RUNNING, FINISHED, FAILED or KILLED
    experiment_id: str
    start_time: int  # ms since the epoch
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]  # the last value of each

    @classmethod
    def of(cls, run: Run) -> StoredRun:
        return cls(
            run.info.run_id,
            run.info.run_name,
            run.info.status,
            run.info.experiment_id,
            run.info.start_time,
            dict(run.data.tags),
            dict(run.data.params),
            dict(run.data.metrics),
        )

    @property
    def role(self) -> str | None:
        return self.tags.get(ROLE_TAG)

    @property
    def run_dir(self) -> str:
        return self.tags.get(RUN_DIR_TAG, "")

    @property
    def overrides(self) -> list[str]:
        return split_overrides(self.tags.get(OVERRIDES_TAG, ""))

    @property
    def error(self) -> str | None:
        return self.tags.get(ERROR_TAG)

    @property
    def job_num(self) -> int | None:
        num = self.tags.get(JOB_NUM_TAG)
        return int(num) if num is not None and num.isdigit() else None


def _quoted(value: str) -> str:
    """A string literal of MLflow's filter syntax, which has no escape character: single or double quotes."""
    for quote in ("'", '"'):
        if quote not in value:
            return f"{quote}{value}{quote}"
    raise ValueError(f"{value!r}: holds both quote characters, which an MLflow search filter cannot match")


def run_filter(
    role: str | None = None,
    status: str | None = None,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> str:
    """MLflow's search filter for runs with all of these (None: any)."""
    terms = [f"tags.`{ROLE_TAG}` = {_quoted(role)}"] if role else []
    terms += [f"tags.`{PARENT_TAG}` = {_quoted(parent_run_id)}"] if parent_run_id else []
    terms += [f"attributes.status = {_quoted(status)}"] if status else []
    terms += [f"tags.`{k}` = {_quoted(v)}" for k, v in (tags or {}).items()]
    return " and ".join(terms)


class MlflowStore:
    """One experiment's records (created when missing), or, with experiment=None, a reader of every
    experiment of the store that creates nothing (reports, the gate)."""

    def __init__(self, tracking_uri: str, experiment: str | None, retry: Retry = with_retry):
        check_tracking_uri(tracking_uri)
        if redact.text(tracking_uri) != tracking_uri:
            # MLflow prints its 'View run at' links with the URI as given, password and all, to stdout.
            os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        self.tracking_uri = tracking_uri
        self.retry = retry
        self._file_seen = False
        with first_open_lock(tracking_uri):
            self.client = MlflowClient(tracking_uri=tracking_uri)
            self.experiment_id = self._experiment_id(experiment) if experiment is not None else None

    def _call(self, call: Callable, *args: Any, **kwargs: Any) -> Any:
        """One MLflow call, retried while busy; a SQLite store whose file was removed after it was opened
        fails at once (MLflow would write to the removed file, or retry its read-only errors for minutes)."""
        if self.tracking_uri.startswith("sqlite:///"):
            if Path(self.tracking_uri.removeprefix("sqlite:///")).exists():
                self._file_seen = True
            elif self._file_seen:
                raise TrackingError(f"{self.tracking_uri}: the store's file was removed")
        return self.retry(call, *args, **kwargs)

    def _experiment_id(self, name: str) -> str:
        """The experiment's id, created when missing; either way of the model-training kind unless
        it names another (an experiment made before ghsweep tagged it, or by MLflow itself)."""
        found = self._call(self.client.get_experiment_by_name, name)
        if found is None:
            try:
                return self.client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND})
            except MlflowException:
                # Another job created it between our look-up and our create.
                found = self._call(self.client.get_experiment_by_name, name)
        if EXPERIMENT_KIND_TAG not in found.tags:
            self._call(self.client.set_experiment_tag, found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
        return found.experiment_id

    # Names, params and tags pass through ghsweep.tracking.redact: no secret reaches the store.
    def start_run(self, run_name: str, role: str, tags: Mapping[str, object], parent_run_id: str | None = None) -> str:
        """A RUNNING run of a sweep (role ROLE_SWEEP) or of one combination (ROLE_RUN) in the experiment."""
        if role not in (ROLE_SWEEP, ROLE_RUN):
            raise ValueError(f"role={role!r}: not a ghsweep run role; accepted: {ROLE_SWEEP}, {ROLE_RUN}")
        all_tags = {ROLE_TAG: role, **{k: redact.text(str(v)) for k, v in tags.items()}}
        if parent_run_id:
            all_tags[PARENT_TAG] = parent_run_id
        run = self._call(self.client.create_run, self.experiment_id, run_name=redact.run_name(run_name), tags=all_tags)
        return run.info.run_id

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        items = [Param(k, v[:MAX_PARAM_VALUE_CHARS]) for k, v in redact.params(params).items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self._call(self.client.log_batch, run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])

    def set_tags(self, run_id: str, tags: Mapping[str, object]) -> None:
        items = [RunTag(k, redact.text(str(v))) for k, v in tags.items()]
        for i in range(0, len(items), MAX_TAGS_PER_BATCH):
            self._call(self.client.log_batch, run_id, tags=items[i : i + MAX_TAGS_PER_BATCH])

    def log_metrics(self, run_id: str, points: Iterable[tuple[str, float, int]]) -> int:
        """Log (name, value, step) points in batches; returns how many were sent."""
        now_ms = int(time.time() * 1000)
        return self.log_metric_series(run_id, [(name, value, step, now_ms) for name, value, step in points])

    def log_metric_series(self, run_id: str, points: Iterable[tuple[str, float, int, int]]) -> int:
        """Log (name, value, step, timestamp in ms) points in batches; returns how many were sent."""
        items = [Metric(name, float(value), stamp, step) for name, value, step, stamp in points]
        for i in range(0, len(items), MAX_METRICS_PER_BATCH):
            self._call(self.client.log_batch, run_id, metrics=items[i : i + MAX_METRICS_PER_BATCH])
        return len(items)

    def log_artifacts(self, run_id: str, paths: Iterable[Path], artifact_path: str | None = None) -> None:
        for path in paths:
            if path.exists():
                self._call(self.client.log_artifact, run_id, str(path), artifact_path)

    def finish(self, run_id: str, status: RunStatus) -> None:
        self._call(self.client.set_terminated, run_id, status=status)

    def end_run(self, run_id: str, status: RunStatus, error: str, tags: Mapping[str, object] | None = None) -> None:
        """End a run that did not finish (FAILED or KILLED), its status and why on its tags."""
        self.set_tags(run_id, {STATUS_TAG: status, ERROR_TAG: error, **(tags or {})})
        self.finish(run_id, status)

    def reopen(self, run_id: str) -> None:
        """A run that an earlier attempt of its job ended, RUNNING again for the attempt that goes on
        with it (a SLURM job requeued): its end and its reasons for failing are taken off."""
        run = self._call(self.client.get_run, run_id)
        for tag in (ERROR_TAG, FAILURE_CLASS_TAG):
            if tag in run.data.tags:
                self._call(self.client.delete_tag, run_id, tag)
        if run.info.status != RunStatus.RUNNING:
            self._call(self.client.update_run, run_id, status=RunStatus.RUNNING)
            self.set_tags(run_id, {STATUS_TAG: RunStatus.RUNNING})

    def get_run(self, run_id: str) -> StoredRun:
        return StoredRun.of(self._call(self.client.get_run, run_id))

    def search(
        self,
        role: str | None = None,
        status: str | None = None,
        parent_run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        limit: int | None = None,
    ) -> list[StoredRun]:
        """The runs with all of these, newest first (at most `limit`), in the store's experiment, or in
        every experiment for a reader."""
        experiments = (
            [self.experiment_id]
            if self.experiment_id is not None
            else [e.experiment_id for e in self._call(self.client.search_experiments)]
        )
        found: list[StoredRun] = []
        token = None
        while limit is None or len(found) < limit:
            page = self._call(
                self.client.search_runs,
                experiments,
                run_filter(role, status, parent_run_id, tags),
                max_results=min(SEARCH_PAGE, limit or SEARCH_PAGE),
                order_by=["attributes.start_time DESC"],
                page_token=token,
            )
            found += [StoredRun.of(r) for r in page]
            token = page.token
            if not token:
                break
        return found[:limit]

    def metric_history(self, run_id: str, name: str) -> list[tuple[int, float]]:
        """(step, value) of every point of one metric, by step."""
        return sorted((m.step, m.value) for m in self._call(self.client.get_metric_history, run_id, name))

    def artifact_text(self, run_id: str, path: str) -> str | None:
        """The text of one artifact (`folder/file`), or None when the run has none there."""
        folder = path.rpartition("/")[0] or None
        if path not in {a.path for a in self._call(self.client.list_artifacts, run_id, folder)}:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            return Path(self._call(self.client.download_artifacts, run_id, path, tmp)).read_text()

    def artifact_paths(self, run_id: str, folder: str | None = None) -> set[str]:
        return {a.path for a in self._call(self.client.list_artifacts, run_id, folder)}

    def download_artifacts(self, run_id: str, dest: Path) -> Path:
        """Every artifact of the run, under `dest`."""
        dest.mkdir(parents=True, exist_ok=True)
        return Path(self._call(self.client.download_artifacts, run_id, "", str(dest)))
