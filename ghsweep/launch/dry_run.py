"""`dry_run=true`: what each combination would run, where, and with which SLURM parameters."""

from __future__ import annotations

import shlex
from pathlib import Path

from omegaconf import DictConfig

from ghsweep.config.validate import ConfigError
from ghsweep.launch.worker_process import worker_command


def describe(num: int, name: str, run_dir: Path, cfg: DictConfig, launch: str) -> str:
    """One combination: its run directory, its worker command and how it is launched."""
    try:
        command = shlex.join(worker_command(cfg, run_dir))
    except ConfigError as exc:
        command = f"(not runnable) {exc}"
    lines = [f"#{num} {name}", f"  run dir: {run_dir}", f"  worker:  {command}", f"  launch:  {launch}"]
    if cfg.profile.name not in ("none", "torch"):
        # The profile plan needs the node's GPU and nsys, so it is made there, when the job starts.
        lines.append(f"  profile: {cfg.profile.name}: where the node has a GPU and nsys, `nsys profile ...` goes "
                     "between the container and python (plan made on the node)")
    if cfg.backend.name == "nemo":
        # Imported only here: composing a NeMo recipe needs NeMo in this interpreter.
        from ghsweep.train.nemo.recipe import describe_recipe

        lines.append(describe_recipe(cfg, run_dir))
    return "\n".join(lines)
