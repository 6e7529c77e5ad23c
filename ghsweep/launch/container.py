"""The container a worker runs in: `apptainer exec --nv` / `singularity exec --nv` with binds and env.

Built as an argument list; user values (image, binds, env values) are single arguments and never
pass through a shell.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from ghsweep.core.errors import ConfigError

RUNTIMES = ("apptainer", "singularity")


def container_prefix(cfg: DictConfig, run_dir: Path) -> list[str]:
    """`RUNTIME exec [--nv] --bind ... --env ... IMAGE`, or [] when no image is configured."""
    c = _container(cfg)
    if not c:
        return []
    if c.runtime not in RUNTIMES:
        raise ConfigError(f"container.runtime={c.runtime}: not a container runtime; accepted: {', '.join(RUNTIMES)}")
    argv = [c.runtime, "exec"]
    if c.nv:
        argv.append("--nv")
    # The worker reads its config from and writes its results to the run directory, wherever it is.
    for bind in [str(Path(run_dir).resolve()), *c.binds]:
        argv += ["--bind", str(bind)]
    for name, value in c.env.items():
        argv += ["--env", f"{name}={value}"]
    argv.append(str(c.image))
    return argv


def tool_finder(prefix: list[str]) -> Callable[[str, str | None], str | None]:
    """capture.find_tool for a worker that runs in the container `prefix` starts. Profilers wrap the
    worker inside the container, so they must exist there (`command -v`), not on the host; the
    command keeps the name (or configured path) the image's PATH resolves, which is also what a dry
    run prints."""

    def find(name: str, configured: str | None) -> str | None:
        tool = configured or name
        proc = subprocess.run(
            [*prefix, "sh", "-c", 'command -v "$1"', "sh", tool], capture_output=True, text=True, timeout=300
        )
        return tool if proc.returncode == 0 and proc.stdout.strip() else None

    return find


def check_container(cfg: DictConfig) -> None:
    """Fail before any GPU time when the runtime or the image is missing on this node."""
    c = _container(cfg)
    if not c:
        return
    if "://" not in str(c.image) and not Path(c.image).exists():
        raise ConfigError(
            f"container.image={c.image}: no such file on this node; accepted: a .sif path or a "
            "docker:// / oras:// URI the runtime can pull"
        )
    if shutil.which(c.runtime) is None:
        found = [r for r in RUNTIMES if shutil.which(r)]
        raise ConfigError(
            f"container.runtime={c.runtime}: not found on PATH of this node; "
            f"accepted: {', '.join(found) if found else 'apptainer or singularity (neither is installed here)'}"
        )


def _container(cfg: DictConfig) -> DictConfig | None:
    # Launch profiles that are not ghsweep's (e.g. the plugin's own submitit_slurm) carry no container.
    c = cfg.get("container")
    return c if c and c.image else None
