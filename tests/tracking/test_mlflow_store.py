"""Which tracking-server errors MlflowStore retries, and that it gives up on the others at once."""

from __future__ import annotations

import json

import pytest
from mlflow.exceptions import MlflowException, RestException

from ghsweep.core.errors import TrackingError
from ghsweep.core.names import HOST_TAG, JOB_NUM_TAG, ROLE_RUN, ROLE_SWEEP, ROLE_TAG, RUN_HASH_TAG, STATUS_TAG
from ghsweep.tracking.mlflow_store import (
    RETRY_DELAYS_S,
    MlflowStore,
    Retry,
    absolute_tracking_uri,
    flatten,
    is_transient,
)

# The body a SQLite-backed `mlflow server` returned when sixteen jobs logged at once.
POOL_EXHAUSTED = {
    "error_code": "BAD_REQUEST",
    "message": "QueuePool limit of size 5 overflow 10 reached, connection timed out, timeout 30.00",
}


def test_busy_server_errors_are_transient_and_bad_requests_are_not():
    assert is_transient(RestException(POOL_EXHAUSTED))
    assert is_transient(
        RestException({"error_code": "BAD_REQUEST", "message": "(sqlite3.OperationalError) database is locked"})
    )
    assert is_transient(RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "try later"}))
    assert not is_transient(
        RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "Changing param values is not allowed"})
    )
    assert not is_transient(MlflowException("Run 'abc' not found"))


def test_retry_waits_out_a_busy_server_then_returns_the_answer():
    answers = [RestException(POOL_EXHAUSTED), RestException(POOL_EXHAUSTED), "logged"]
    slept: list[float] = []

    def flaky_log_batch():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert Retry(sleep=slept.append)(flaky_log_batch) == "logged"
    assert answers == []
    assert slept == list(RETRY_DELAYS_S[:2])


def test_retry_gives_up_after_its_last_delay():
    calls = []

    def always_busy():
        calls.append(1)
        raise RestException(POOL_EXHAUSTED)

    slept: list[float] = []
    with pytest.raises(TrackingError, match="QueuePool limit"):
        Retry(delays_s=(0.5, 2), sleep=slept.append)(always_busy)
    assert len(calls) == 3 and slept == [0.5, 2]


def test_retry_raises_a_real_error_at_once():
    calls = []

    def rejected():
        calls.append(1)
        raise RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": json.dumps({"bad": "value"})})

    with pytest.raises(TrackingError, match="INVALID_PARAMETER_VALUE") as raised:
        Retry(sleep=pytest.fail)(rejected)
    assert len(calls) == 1
    assert isinstance(raised.value.__cause__, RestException)


def test_relative_sqlite_uri_becomes_absolute_and_others_stay(tmp_path):
    assert absolute_tracking_uri("sqlite:///mlflow.db", tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert absolute_tracking_uri("sqlite:////abs/x.db", tmp_path) == "sqlite:////abs/x.db"
    assert absolute_tracking_uri("http://127.0.0.1:5000", tmp_path) == "http://127.0.0.1:5000"


def test_flatten_nests_keys_with_dots():
    assert flatten({"peft": {"r": 16, "targets": ["q", "v"]}, "precision": None}) == {
        "peft.r": "16",
        "peft.targets": "['q', 'v']",
        "precision": "None",
    }


def test_runs_are_found_by_role_parent_status_and_tags_newest_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}", "search_test")
    sweep = store.start_run("sweep a", ROLE_SWEEP, {HOST_TAG: "here"})
    done = store.start_run("run 0", ROLE_RUN, {RUN_HASH_TAG: "h0", JOB_NUM_TAG: "0"}, parent_run_id=sweep)
    store.finish(done, "FINISHED")
    failed = store.start_run("run 1", ROLE_RUN, {RUN_HASH_TAG: "it's"}, parent_run_id=sweep)
    store.end_run(failed, "FAILED", "out of memory", {"ghsweep.slurm_job_id": "7"})
    running = store.start_run("run 2", ROLE_RUN, {}, parent_run_id=sweep)

    assert [r.run_id for r in store.search(parent_run_id=sweep)] == [running, failed, done]
    assert [r.run_id for r in store.search(role=ROLE_SWEEP, status="RUNNING", tags={HOST_TAG: "here"})] == [sweep]
    assert store.search(role=ROLE_SWEEP, tags={HOST_TAG: "elsewhere"}) == []
    assert [r.run_id for r in store.search(role=ROLE_RUN, status="FINISHED", tags={RUN_HASH_TAG: "h0"})] == [done]
    assert [r.run_id for r in store.search(tags={RUN_HASH_TAG: "it's"})] == [failed]  # a quote in a value
    assert len(store.search(role=ROLE_RUN, limit=2)) == 2

    ended = store.get_run(failed)
    assert (ended.status, ended.error, ended.tags[STATUS_TAG], ended.tags["ghsweep.slurm_job_id"]) == (
        "FAILED",
        "out of memory",
        "FAILED",
        "7",
    )
    assert store.get_run(done).job_num == 0 and ended.job_num is None


def test_a_reader_searches_every_experiment_and_creates_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    a, b = MlflowStore(uri, "a"), MlflowStore(uri, "b")
    ids = {a.start_run("sweep a", ROLE_SWEEP, {}), b.start_run("sweep b", ROLE_SWEEP, {})}
    reader = MlflowStore(uri, experiment=None)
    assert {r.run_id for r in reader.search(role=ROLE_SWEEP)} == ids
    assert reader.experiment_id is None
    with pytest.raises(TrackingError, match="not found"):
        reader.get_run("0" * 32)


def test_a_run_has_one_of_the_two_roles(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}", "roles")
    with pytest.raises(
        ValueError, match=r"^role=\{'ghsweep.role': 'sweep'\}: not a ghsweep run role; accepted: sweep, run$"
    ):
        store.start_run("sweep x", {ROLE_TAG: ROLE_SWEEP}, {})  # type: ignore[arg-type]
    assert store.search() == []
