"""The sweep manifest: written once at sweep start, read by every job of the sweep.

It carries the MLflow parent run and the absolute tracking URI to jobs that may run on other
nodes, through the shared sweep directory.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from ghsweep.core.atomic import write_atomic
from ghsweep.core.errors import SweepDirInUse, SweepDirUnwritable, SweepNotFound
from ghsweep.core.run_dir import SWEEP_END, SWEEP_LOCK, SWEEP_MANIFEST
from ghsweep.core.run_result import RunStatus
from ghsweep.tracking import redact

# The manifest each sweep of this process saved, by sweep directory: its jobs and its end still know
# their store and parent run when the directory is removed under them.
_saved: dict[Path, SweepManifest] = {}
# The lock of each sweep directory this process claimed, held open (and so locked) while it lives.
_locks: dict[Path, IO[str]] = {}


# What live_holder says of a lock that no process holds, and of one whose holder has not yet written who it is.
NOBODY, NOT_SAID_YET = "", "?"


def live_holder(sweep_dir: Path) -> str | None:
    """The identity of the live process whose sweep holds `sweep_dir` (SweepManifest.claim); NOBODY when
    no process holds it; None when there is no lock to ask (a sweep of an earlier ghsweep, or its
    directory removed). A lock on one host's file system is honest whatever PID namespace its holder
    runs in."""
    try:
        lock = open(sweep_dir / SWEEP_LOCK)  # noqa: SIM115 (closed below, after the look)
    except OSError:
        return None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return lock.read().strip() or NOT_SAID_YET
        fcntl.flock(lock, fcntl.LOCK_UN)
        return NOBODY


@dataclass(frozen=True)
class SweepManifest:
    tracking_uri: str
    experiment: str
    parent_run_id: str
    command: str
    # The sweep's combinations, as its start counted them (0 where a sweeper asks for them as it goes,
    # a tuning study): what an interrupted sweep's summary counts its runs against.
    combinations: int = 0

    @classmethod
    def claim(cls, sweep_dir: Path, holder: str) -> bool:
        """Take the sweep directory for this process's sweep, for as long as the process lives: its lock
        (SWEEP_LOCK, holding `holder`, this process's identity) taken, or SweepDirInUse when a live sweep
        holds it (two sweeps in one directory would mix their runs; sweeps started in the same second
        get the same default one), or when it holds files of something that is no sweep (ghsweep writes
        and removes files there). True when it holds an earlier sweep (its manifest), which this one
        resumes or refuses; False for a new sweep (a directory claimed by a sweep that stopped as it
        started holds no manifest, or an empty one, and nothing of it ran)."""
        try:
            return cls._take(sweep_dir, holder)
        except OSError as exc:
            raise SweepDirUnwritable(
                f"hydra.sweep.dir={sweep_dir}: the sweep directory cannot be written ({exc.strerror or exc}: "
                f"{exc.filename or sweep_dir}); set hydra.sweep.dir to a directory you can write"
            ) from None

    @classmethod
    def _take(cls, sweep_dir: Path, holder: str) -> bool:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        # Before the lock file is made: a directory that is not a sweep's gets nothing of this one.
        # An empty folder holds nothing to lose (a run directory made ahead, e.g. a mount point).
        others = sorted(
            p.name
            for p in sweep_dir.iterdir()
            if p.name not in (SWEEP_LOCK, SWEEP_MANIFEST) and not (p.is_dir() and not any(p.iterdir()))
        )
        if others and not cls._holds_sweep(sweep_dir):
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            raise SweepDirInUse(
                f"hydra.sweep.dir={sweep_dir}: holds files but no sweep ({shown}; no {SWEEP_MANIFEST}); a sweep "
                "writes and replaces files in its directory: set hydra.sweep.dir to a new or empty directory"
            )
        lock = open(sweep_dir / SWEEP_LOCK, "a+")  # noqa: SIM115 (held open for the life of the process)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            running = lock.read().strip() or "another process"
            lock.close()
            raise SweepDirInUse(
                f"hydra.sweep.dir={sweep_dir}: a sweep is running in it ({running}); wait for it to end, or set "
                "hydra.sweep.dir to a new directory"
            ) from None
        lock.truncate(0)
        lock.write(holder)
        lock.flush()
        _locks[sweep_dir.absolute()] = lock
        return cls._holds_sweep(sweep_dir)

    @classmethod
    def _holds_sweep(cls, sweep_dir: Path) -> bool:
        try:
            return cls.load(sweep_dir) is not None
        except SweepNotFound:  # an empty manifest: claimed by a sweep that stopped as it started
            return False

    def save(self, sweep_dir: Path) -> None:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        # Jobs need the real URI; one with a password is readable by the user only, as config.yaml is.
        secret = redact.text(self.tracking_uri) != self.tracking_uri
        write_atomic(sweep_dir / SWEEP_MANIFEST, json.dumps(asdict(self), indent=2), mode=0o600 if secret else 0o644)
        _saved[sweep_dir.absolute()] = self

    @classmethod
    def of_sweep(cls, sweep_dir: Path) -> SweepManifest | None:
        """The manifest of the sweep in `sweep_dir`: the one this process saved (a local sweep's jobs
        and end), else its file (a job on another node, `python -m ghsweep.status`)."""
        return _saved.get(sweep_dir.absolute()) or cls.load(sweep_dir)

    @classmethod
    def load(cls, sweep_dir: Path) -> SweepManifest | None:
        path = sweep_dir / SWEEP_MANIFEST
        if not path.exists():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            # Claimed and never saved (the sweep stopped as it started), or cut short.
            raise SweepNotFound(
                f"{path}: empty or cut short: the sweep stopped before its first job and recorded no run; "
                "the same command starts it again there"
            ) from None

    @classmethod
    def require(cls, sweep_dir: Path) -> SweepManifest:
        """The manifest of a sweep that must have one: its callback wrote it when the sweep started."""
        manifest = cls.of_sweep(sweep_dir)
        if manifest is None:
            raise FileNotFoundError(
                f"{sweep_dir / SWEEP_MANIFEST}: no sweep manifest; the sweep's callback writes it at sweep start"
            )
        return manifest


@dataclass(frozen=True)
class SweepEnd:
    """How a sweep ended, in its directory: its MLflow run's status and the runs that failed (none
    where failures are part of it, a tuning study's trials). What `python -m ghsweep.status` answers
    from without importing MLflow."""

    status: str
    runs: int
    failed: list[str]

    @classmethod
    def of(cls, runs: Sequence[Any], interrupted: bool, failures_expected: bool) -> SweepEnd:
        """The end of a sweep whose runs (each with a name and a RunStatus) are `runs`: FAILED when one
        did not finish that was expected to. One cancelled from outside counts; one that the sweep's
        own interrupt stopped does not (the same command resumes it)."""
        stopped = RunStatus.KILLED if interrupted else None
        failed = [] if failures_expected else [r.name for r in runs if r.status not in (RunStatus.FINISHED, stopped)]
        status = RunStatus.KILLED if interrupted else RunStatus.FAILED if failed else RunStatus.FINISHED
        return cls(status.value, len(runs), failed)

    @property
    def is_failure(self) -> bool:
        """What the sweep's command exits non-zero for: its MLflow run FAILED, or one of its runs did."""
        return self.status == RunStatus.FAILED or bool(self.failed)

    def save(self, sweep_dir: Path) -> None:
        write_atomic(sweep_dir / SWEEP_END, json.dumps(asdict(self), indent=2), mode=0o644)

    @classmethod
    def load(cls, sweep_dir: Path) -> SweepEnd | None:
        """The end recorded in `sweep_dir`; None where there is none, or one cut short (then MLflow answers)."""
        try:
            return cls(**json.loads((sweep_dir / SWEEP_END).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    @staticmethod
    def clear(sweep_dir: Path) -> None:
        """A sweep that resumes has not ended: the earlier end would answer for it if its process died."""
        (sweep_dir / SWEEP_END).unlink(missing_ok=True)
