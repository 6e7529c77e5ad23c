"""A new SQLite store's tables come from one file made once per MLflow version: the store MLflow then
opens is the one it would have made itself, and without a usable cache MLflow makes the tables."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mlflow.tracking import MlflowClient

from ghsweep.core.user_cache import user_cache
from ghsweep.tracking.empty_store import empty_tables
from ghsweep.tracking.mlflow_store import MlflowStore


def tables(db: Path) -> dict[str, object]:
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT name, sql FROM sqlite_master WHERE type IN ('table', 'index')").fetchall()
        version = con.execute("SELECT version_num FROM alembic_version").fetchall()
    # Each table's columns and constraints as a set: MLflow's migrations rebuild tables with their
    # constraints in no fixed order.
    schema = {name: sorted(line.strip().rstrip(",") for line in (sql or "").splitlines()) for name, sql in rows}
    return {**schema, "alembic_version": version}


def test_a_new_store_is_the_one_mlflow_makes_from_tables_made_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    MlflowClient("sqlite:///by_mlflow.db").search_experiments()  # MLflow's own tables, before any copy
    first = MlflowStore("sqlite:///first.db", "ghsweep")
    made = list(user_cache().glob("mlflow-*-empty.db"))
    assert len(made) == 1 and not list(user_cache().glob("*.partial"))
    second = MlflowStore("sqlite:///second.db", "ghsweep")
    assert tables(Path("first.db")) == tables(Path("second.db")) == tables(Path("by_mlflow.db"))
    # MLflow adds its Default experiment on first open, with this store's artifact location.
    by_mlflow = MlflowClient("sqlite:///by_mlflow.db").get_experiment("0")
    for store in (first, second):
        assert store.client.get_experiment("0").artifact_location == by_mlflow.artifact_location
        assert store.client.get_experiment(store.experiment_id).name == "ghsweep"
    # The cached tables stay empty: nothing a store records reaches them.
    with sqlite3.connect(made[0]) as con:
        assert con.execute("SELECT COUNT(*) FROM experiments").fetchone() == (0,)


def test_without_a_usable_cache_mlflow_makes_the_tables(tmp_path, monkeypatch):
    (tmp_path / "not_a_folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not_a_folder"))
    store = MlflowStore(f"sqlite:///{tmp_path}/mlflow.db", "ghsweep")
    run_id = store.start_run("r", "run", {})
    assert store.get_run(run_id).status == "RUNNING"


def test_making_the_cached_tables_says_nothing(tmp_path, monkeypatch, capfd):
    # MLflow announces the tables it makes on stderr; the cache's file is not a store the user asked for,
    # and whichever command first needs a store would print it (a report, a sweep's first line).
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    capfd.readouterr()
    made = empty_tables()
    assert made.exists()
    assert capfd.readouterr() == ("", "")
