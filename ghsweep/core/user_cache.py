"""The user's cache folder of ghsweep: `$XDG_CACHE_HOME/ghsweep`, else `~/.cache/ghsweep`.

What is kept there can be made again from nothing (MLflow's empty tables, file digests, bytecode);
on a cluster it is usually on the home directory every node shares.
"""

from __future__ import annotations

import os
from pathlib import Path


def user_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ghsweep"
