"""A combination of a local sweep as the launcher hands it to its job, for tests that call the job's
own functions (ghsweep.launch.job) on one run directory."""

from __future__ import annotations

from pathlib import Path

from ghsweep.core.run_result import RunResult
from ghsweep.launch.combination import Combination


def combination(run_dir: Path, name: str = "train.max_steps=2") -> Combination:
    """Combination 0 of a local sweep in `run_dir`'s parent, with overrides `[name]`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return Combination(
        name=name,
        run_dir=run_dir,
        overrides=[name],
        num=0,
        in_sweep=False,
        sweep_dir=run_dir.parent,
        choices={"precision": "fp32"},
        launcher="local",
        cwd=str(run_dir.parent),
    )


def failed_result(combo: Combination) -> RunResult:
    """`combo`'s result before its job has trained: FAILED, recorded in no MLflow run."""
    return combo.result("FAILED", "not-recorded-here")
