"""What a sweep left in its directories."""

from __future__ import annotations

import json
from pathlib import Path


def results(sweep_dir: Path) -> dict[int, dict]:
    """result.json of each job, by job number."""
    return {int(p.parent.name): json.loads(p.read_text()) for p in sweep_dir.glob("*/result.json")}


def only_sweep_dir(cwd: Path) -> Path:
    """The one sweep directory a multirun in `cwd` made."""
    found = [p.parent for p in cwd.glob("multirun/*/*/ghsweep_sweep.json")]
    assert len(found) == 1, found
    return found[0]


def assert_nothing_ran(cwd: Path) -> None:
    """A command in `cwd` trained, submitted and recorded nothing."""
    assert not (cwd / "mlflow.db").exists()
    assert not list(cwd.rglob(".submitit"))
    assert not list(cwd.rglob("worker.log")) and not list(cwd.rglob("ghsweep_jobs.json"))
