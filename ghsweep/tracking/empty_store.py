"""A new SQLite store's tables, copied from one made once per MLflow version.

MLflow makes a new SQLite store's tables by running every one of its schema migrations, 4-10 s on a
2-core machine, on every new `mlflow.db`: a first sweep, each sweep of a fresh directory, each test
that starts from nothing. The same empty tables are made once per MLflow version in the user's cache
(`$XDG_CACHE_HOME/ghsweep`, else `~/.cache/ghsweep`) and copied (milliseconds). They hold no
experiment: MLflow adds its Default experiment, with this store's own artifact location, when it
first opens the copy, as it does for tables it made itself.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import mlflow

from ghsweep.core.user_cache import user_cache

log = logging.getLogger(__name__)


def empty_tables() -> Path:
    """The file of empty, fully migrated tables of this MLflow version, made on first use."""
    made = user_cache() / f"mlflow-{mlflow.__version__}-empty.db"
    if made.exists():
        return made
    from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine

    made.parent.mkdir(parents=True, exist_ok=True)
    partial = made.with_name(f"{made.name}.{os.getpid()}.partial")
    engine = create_sqlalchemy_engine(f"sqlite:///{partial}")
    # MLflow says "Creating initial MLflow database tables..." on stderr: of the cache's file, not a store
    # the user made, in whatever command first needed a store.
    mlflow_db_log = logging.getLogger("mlflow.store.db.utils")
    level = mlflow_db_log.level
    mlflow_db_log.setLevel(logging.WARNING)
    try:
        _initialize_tables(engine)  # what MLflow runs on a new file: its tables, then every migration
    finally:
        mlflow_db_log.setLevel(level)
        engine.dispose()
    os.replace(partial, made)  # whole or not at all; two processes making it at once both succeed
    return made


def copy_empty_tables(store: Path) -> None:
    """Give a SQLite store that does not exist yet its empty tables from the cache. Any failure (no
    writable cache, an MLflow whose internals moved) leaves the store to MLflow, which makes them."""
    if store.exists():
        return
    try:
        shutil.copyfile(empty_tables(), store)
    except Exception as exc:  # only slower: MLflow makes the tables as before
        store.unlink(missing_ok=True)
        log.debug("%s: MLflow makes its tables (no copy: %s)", store, exc)
