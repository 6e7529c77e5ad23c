"""A local sweep started in the background, to be stopped while one of its jobs trains."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from ghsweep.launch.worker_process import worker_pid
from tests.support.cli import start_cli

LONG_STEPS = 60
# Job 1 trains long enough to be stopped once it has started; jobs 0 and 2 are short.
SWEEP = [
    "-m",
    "experiment=smoke",
    "precision=fp32",
    f"train.max_steps=3,{LONG_STEPS},4",
    "train.seq_length=64",
    "train.log_every=1",
]


def start_sweep(cwd: Path, sweep_dir: str) -> subprocess.Popen:
    """SWEEP started in `cwd`, its jobs in `sweep_dir`."""
    return start_cli([*SWEEP, f"hydra.sweep.dir={sweep_dir}"], cwd)


def wait_until_training(
    run_dir: Path, proc: subprocess.Popen, max_steps: int = LONG_STEPS, timeout_s: float = 300
) -> int:
    """The pid of the worker of `run_dir` (a job of `max_steps` steps), once it has trained a step."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = run_dir / "worker.log"
        if log.exists() and f"step 1/{max_steps}" in log.read_text():
            return worker_pid(run_dir)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise TimeoutError(f"{run_dir.name} never trained")
