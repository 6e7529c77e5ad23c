"""What decides a run's result beyond its config: the code that runs it and the input files it reads.

Both are part of the run's identity (launch.resume.run_hash), so a run is reused only when it would be
the same: a code change or new data under the same `data.path` trains again.

The code is ghsweep's version and, where it runs from a git checkout, the checkout's commit; uncommitted
changes to the package add `+dirty` and a hash of their diff, so two different edits differ. It is
read once per process (a sweep, or a SLURM job).

An input file's content is its SHA-256, cached by path, size and modification time in the user's cache
folder ($XDG_CACHE_HOME/ghsweep, else ~/.cache/ghsweep): a model folder of many GB is read once, not
per sweep. A folder's digest is that of its files' names and digests.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

import ghsweep
from ghsweep.core.atomic import write_atomic
from ghsweep.core.user_cache import user_cache

# The config keys that name files a run reads; their contents are part of its identity.
INPUT_KEYS = ("data.path", "model.path")
# The package's sources: a change elsewhere in the checkout (tests, docs) does not change what runs.
CODE_PATHS = ("ghsweep", "hydra_plugins")
CHUNK = 1 << 20


def _git(checkout: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode(errors="replace") if out.returncode == 0 else None


def checkout_commit(checkout: Path) -> str | None:
    """`commit HASH` of a git checkout, with `+dirty.DIFFHASH` when the package's sources differ from it;
    None where `checkout` is not one (a wheel's site-packages)."""
    if not (checkout / ".git").exists():
        return None
    commit = _git(checkout, "rev-parse", "HEAD")
    if commit is None:
        return None
    diff = _git(checkout, "diff", "HEAD", "--no-ext-diff", "--", *CODE_PATHS) or ""
    dirty = f"+dirty.{hashlib.sha256(diff.encode()).hexdigest()[:12]}" if diff else ""
    return f"commit {commit.strip()[:12]}{dirty}"


# The code identity of the sweep a job belongs to, handed to its jobs in their environment: a SLURM node
# or a container without git, or without the checkout's .git, must record the identity the launcher
# looked up, or a resume would never find the runs it made.
CODE_ENV = "GHSWEEP_CODE"


@functools.cache
def code_version() -> str:
    """`ghsweep VERSION`, with the commit of the checkout it runs from (checkout_commit) where there is one;
    the sweep's (CODE_ENV) in one of its jobs."""
    handed = os.environ.get(CODE_ENV)
    if handed:
        return handed
    commit = checkout_commit(Path(ghsweep.__file__).resolve().parents[1])
    return f"ghsweep {ghsweep.__version__}" + (f" {commit}" if commit else "")


def hand_code_version_to_jobs() -> None:
    """Put the sweep's code identity in the environment its jobs inherit (local, submitit, srun)."""
    os.environ[CODE_ENV] = code_version()


def _cache_file() -> Path:
    return user_cache() / "file_digests.json"


def _read_cache() -> dict[str, Any]:
    try:
        cache = json.loads(_cache_file().read_text())
    except (OSError, ValueError):  # none yet, or damaged: digests are made again
        return {}
    return cache if isinstance(cache, dict) else {}


def _file_digest(path: Path, cache: dict[str, Any]) -> str:
    stat = path.stat()
    key, seen = str(path.resolve()), [stat.st_size, stat.st_mtime_ns]
    cached = cache.get(key)
    if isinstance(cached, list) and cached[:2] == seen:
        return str(cached[2])
    digest = hashlib.sha256()
    with path.open("rb") as content:
        while chunk := content.read(CHUNK):
            digest.update(chunk)
    cache[key] = [*seen, digest.hexdigest()]
    return digest.hexdigest()


def input_digest(path: Path, cache: dict[str, Any]) -> str:
    """`sha256:HEX` of a file's content, or of a folder's files (their relative names and digests);
    `missing` for a path that is not there (the run fails on it)."""
    if path.is_file():
        return "sha256:" + _file_digest(path, cache)
    if not path.is_dir():
        return "missing"
    listing = "".join(
        f"{f.relative_to(path)}\0{_file_digest(f, cache)}\n" for f in sorted(path.rglob("*")) if f.is_file()
    )
    return "sha256:" + hashlib.sha256(listing.encode()).hexdigest()


def input_digests(cfg: DictConfig) -> dict[str, str]:
    """The digest of each input file the config names (INPUT_KEYS set), by key."""
    paths = {key: OmegaConf.select(cfg, key, default=None) for key in INPUT_KEYS}
    named = {key: Path(str(value)) for key, value in paths.items() if value}
    if not named:
        return {}
    cache = _read_cache()
    before = dict(cache)
    digests = {key: input_digest(path, cache) for key, path in named.items()}
    if cache != before:
        try:
            _cache_file().parent.mkdir(parents=True, exist_ok=True)
            write_atomic(_cache_file(), json.dumps(cache))
        except OSError:  # a cache: a read-only home only costs reading the files again
            pass
    return digests
