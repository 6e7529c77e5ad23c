"""What a worker measured (summary.json): the same shape from every backend."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ghsweep.core.atomic import write_atomic
from ghsweep.core.run_dir import SUMMARY


@dataclass
class RunSummary:
    # MLflow metrics: tokens_per_s, step_time_ms, peak_mem_gb, loss, mfu, ... (names in docs/measurements.md).
    metrics: dict[str, float] = field(default_factory=dict)
    # Seconds (and epoch stamps) of the worker's stages: import_s, setup_s, train_s, ready_at, ...
    timing: dict[str, float] = field(default_factory=dict)
    # Facts about the run that are not numbers to compare: library versions, kernels chosen, notes.
    info: dict[str, object] = field(default_factory=dict)

    def save(self, run_dir: Path) -> None:
        write_atomic(run_dir / SUMMARY, json.dumps(asdict(self), indent=2), mode=0o644)

    @classmethod
    def load(cls, run_dir: Path) -> RunSummary:
        return cls(**json.loads((run_dir / SUMMARY).read_text()))
