"""The sweep manifest: written once at sweep start, read by every job of the sweep.

It carries the MLflow parent run and the absolute tracking URI to jobs that may run on other
nodes, through the shared sweep directory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ghsweep.core.atomic import write_atomic
from ghsweep.core.errors import SweepDirInUse, SweepNotFound
from ghsweep.core.run_dir import SWEEP_MANIFEST
from ghsweep.tracking import redact

# The manifest each sweep of this process saved, by sweep directory: its jobs and its end still know
# their store and parent run when the directory is removed under them.
_saved: dict[Path, SweepManifest] = {}


@dataclass(frozen=True)
class SweepManifest:
    tracking_uri: str
    experiment: str
    parent_run_id: str
    command: str

    @staticmethod
    def claim(sweep_dir: Path) -> None:
        """Take the sweep directory for a new sweep, atomically: two sweeps in one directory would mix
        their run directories and results (sweeps started in the same second get the same default one)."""
        sweep_dir.mkdir(parents=True, exist_ok=True)
        try:
            (sweep_dir / SWEEP_MANIFEST).open("x").close()
        except FileExistsError:
            raise SweepDirInUse(
                f"hydra.sweep.dir={sweep_dir}: already holds a sweep ({SWEEP_MANIFEST}); start the "
                "sweep again (the default directory is named by the second) or set hydra.sweep.dir "
                "to a new directory"
            ) from None

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
                "start it again in a new hydra.sweep.dir, or remove this file"
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
