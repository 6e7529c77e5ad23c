"""Bytecode for a sweep's processes where this Python keeps none (`worker.bytecode_cache`).

Python compiles each module it imports from source unless it finds the module's bytecode, which it
writes beside the source (`__pycache__`). An environment that sets PYTHONDONTWRITEBYTECODE (as many
container images do), or whose packages are read-only and came without bytecode, compiles torch,
transformers and peft again in every process: every worker of a sweep, and every job on every node.
On a GPU machine like that their imports took 15-18 s against 8-9 s from bytecode, and they are what
a sweep's first combination (and each fresh worker) waits for.

There ghsweep keeps the bytecode in its user cache (`$XDG_CACHE_HOME/ghsweep/pycache`, through
Python's own PYTHONPYCACHEPREFIX), never beside the sources: the first process writes it, the
others read it. Python checks each file against its source, so a cache shared by a cluster's nodes
or kept across upgrades never serves stale code. A prefix the user set is left alone.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ghsweep.core.user_cache import user_cache

PREFIX_ENV = "PYTHONPYCACHEPREFIX"
NO_BYTECODE_ENV = "PYTHONDONTWRITEBYTECODE"
# The package whose bytecode says whether this Python keeps any: the largest import of a worker.
PROBE = "torch"


def keeps_no_bytecode() -> bool:
    """Whether each process here compiles the training libraries from source: bytecode is not written
    (PYTHONDONTWRITEBYTECODE, -B) or torch has none beside its source. False where the user chose a
    prefix of their own."""
    if sys.pycache_prefix is not None:
        return False
    if sys.dont_write_bytecode:
        return True
    spec = importlib.util.find_spec(PROBE)
    if spec is None or spec.origin is None:
        return False
    return not os.path.exists(importlib.util.cache_from_source(spec.origin))


def keep_bytecode(enabled: bool) -> Path | None:
    """Where this Python keeps no bytecode: keep it in the user cache for this process (its later
    imports) and the processes it starts (their environment); the folder, or None when left as it was."""
    if not enabled or not keeps_no_bytecode():
        return None
    folder = user_cache() / "pycache"
    folder.mkdir(parents=True, exist_ok=True)
    sys.pycache_prefix = str(folder)
    sys.dont_write_bytecode = False
    os.environ[PREFIX_ENV] = str(folder)
    os.environ.pop(NO_BYTECODE_ENV, None)
    print(
        f"ghsweep: Python here writes no bytecode of {PROBE} and the other libraries; the sweep's processes keep "
        f"theirs in {folder} (worker.bytecode_cache=false: compile them in every process)",
        flush=True,
    )
    return folder
