"""`dry_run=true`: what each combination would run, where, and with which SLURM parameters."""

from __future__ import annotations

import shlex
from pathlib import Path

from omegaconf import DictConfig

from ghsweep.config.validate import ConfigError
from ghsweep.launch.worker_process import worker_command


def describe(num: int, name: str, run_dir: Path, cfg: DictConfig, launch: str) -> str:
    """Three lines for one combination: its run directory, its worker command and how it is launched."""
    try:
        command = shlex.join(worker_command(cfg, run_dir))
    except ConfigError as exc:
        command = f"(not runnable) {exc}"
    return f"#{num} {name}\n  run dir: {run_dir}\n  worker:  {command}\n  launch:  {launch}"
