"""What one combination of a sweep ended with; written as result.json in its run directory."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

from ghsweep.core.atomic import write_atomic
from ghsweep.core.run_dir import RESULT

# Timing keys (RunResult.timing) the worker times within its own: the parts of setup_s (the device's
# context, the model with its adapters and compiled layers, the data, the optimizer) and of train_s
# (torch.compile's time, the profiler's capture window). A backend that does not time a part leaves it out.
SETUP_PARTS = ("device_s", "model_s", "data_s", "optimizer_s")
TRAIN_PARTS = ("compile_s", "capture_s")
WORKER_PARTS = (*SETUP_PARTS, *TRAIN_PARTS)


class RunStatus(str, Enum):  # noqa: UP042 (enum.StrEnum is Python >= 3.11; 3.10 is supported)
    """How a combination ended: MLflow's run statuses (RUNNING while it trains), and a dry run's own
    two. A str, so result.json, MLflow and every comparison hold the plain name."""

    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    DRY_RUN = "DRY_RUN"  # a dry run's plan, printed
    NOT_RUNNABLE = "NOT_RUNNABLE"  # a dry run's combination that the checks refuse

    def __str__(self) -> str:  # the plain name in f-strings and str(), as enum.StrEnum (Python >= 3.11)
        return self.value


@dataclass
class RunResult:
    name: str
    run_dir: str
    overrides: list[str]
    status: RunStatus
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    mlflow_run_id: str | None = None
    # A combination a resumed sweep did not rerun: its result is this earlier run's (MLflow run id).
    reused: bool = False
    # A failed run's class (ghsweep.core.failures): deterministic or infrastructure.
    failure_class: str | None = None
    # Why each earlier attempt failed, in order: infrastructure failures retried (launcher key `retries`).
    attempts: list[str] = field(default_factory=list)

    def save(self) -> None:
        """Written whole or not at all: a full disk leaves the last complete result.json, never a cut one."""
        write_atomic(Path(self.run_dir) / RESULT, json.dumps(asdict(self), indent=2), mode=0o644)

    @classmethod
    def load(cls, run_dir: Path) -> RunResult:
        raw = json.loads((run_dir / RESULT).read_text())
        return cls(**{**raw, "status": RunStatus(raw["status"])})


def sweep_results(sweep_dir: Path) -> list[tuple[Path, RunResult]]:
    """Each run directory of `sweep_dir` that holds a result, with it, in job order (a directory not
    named by its job number, `hydra.sweep.subdir` set otherwise, first)."""
    dirs = [path.parent for path in sweep_dir.glob(f"*/{RESULT}")]
    return [(d, RunResult.load(d)) for d in sorted(dirs, key=lambda d: int(d.name) if d.name.isdigit() else 0)]
