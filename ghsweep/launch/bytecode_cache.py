"""Bytecode for a sweep's processes where this Python keeps none (`worker.bytecode_cache`).

Python compiles each module it imports from source unless it finds the module's bytecode, which it
writes beside the source (`__pycache__`), and which pip writes as it installs. Packages installed
without it (pip's --no-compile, an image built that way) in an environment that sets
PYTHONDONTWRITEBYTECODE (as many container images do) or on a read-only file system compile torch,
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
    """Whether each process here compiles the training libraries from source: torch has no bytecode
    beside its source (not written there: PYTHONDONTWRITEBYTECODE, -B, a read-only install). Bytecode
    that is there is read whatever PYTHONDONTWRITEBYTECODE says. False where the user chose a prefix."""
    if sys.pycache_prefix is not None:
        return False
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
        f"ghsweep: {PROBE} has no bytecode beside it here, so each process would compile it again; the sweep's "
        f"processes keep theirs in {folder} (worker.bytecode_cache=false: compile in every process)",
        flush=True,
    )
    return folder
