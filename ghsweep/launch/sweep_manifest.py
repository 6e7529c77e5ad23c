"""The sweep manifest: written once at sweep start, read by every job of the sweep.

It carries the MLflow parent run and the absolute tracking URI to jobs that may run on other
nodes, through the shared sweep directory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

MANIFEST_FILE = "ghsweep_sweep.json"


@dataclass(frozen=True)
class SweepManifest:
    tracking_uri: str
    experiment: str
    parent_run_id: str
    command: str

    def save(self, sweep_dir: Path) -> None:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / MANIFEST_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, sweep_dir: Path) -> SweepManifest | None:
        path = sweep_dir / MANIFEST_FILE
        return cls(**json.loads(path.read_text())) if path.exists() else None
