"""The container a worker runs in: `apptainer exec --nv` / `singularity exec --nv` with binds and env,
or SLURM's pyxis plugin (`srun --container-image=...`, enroot underneath).

Built as an argument list; user values (image, binds, env values) are single arguments and never
pass through a shell. Under pyxis, `container.env`'s values reach the container through the
worker's environment (container_env), so no value, secret or not, is on its command line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from ghsweep.config.schema import ConfigSchema, ContainerSchema, choices
from ghsweep.core.errors import ConfigError

RUNTIMES: tuple[str, ...] = choices("container.runtime")
PYXIS = "pyxis"


def container_prefix(config: ConfigSchema, run_dir: Path) -> list[str]:
    """`RUNTIME exec [--nv] --bind ... --env ... IMAGE`, or [] when no image is configured."""
    c = _container(config)
    if not c:
        return []
    if c.runtime not in RUNTIMES:
        raise ConfigError(f"container.runtime={c.runtime}: not a container runtime; accepted: {', '.join(RUNTIMES)}")
    if c.runtime == PYXIS:
        return pyxis_prefix(c, run_dir)
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


def pyxis_prefix(c: ContainerSchema, run_dir: Path) -> list[str]:
    """`srun --overlap --nodes=1 --ntasks=1 [--nodelist=THIS_NODE] --container-image=IMAGE
    --container-mounts=RUN_DIR,BINDS --container-workdir=RUN_DIR [--container-env=NAMES]`.

    A step of the job's own allocation, beside the step that runs ghsweep (--overlap), on this node
    (inside a SLURM job: SLURMD_NODENAME); it gets the job's GPUs. pyxis always exposes the GPUs
    (container.nv does not apply). `--container-env` names the variables whose host values replace
    the image's; their values are in the worker's environment (container_env)."""
    run = str(Path(run_dir).resolve())
    mounts = [run, *c.binds]
    bad = [m for m in mounts if "," in m]
    if bad:
        raise ConfigError(
            f"container.binds={bad[0]}: pyxis separates mounts with commas, so a mount cannot hold one; "
            "accepted: SRC[:DST[:ro]] without commas"
        )
    argv = ["srun", "--overlap", "--nodes=1", "--ntasks=1"]
    if os.environ.get("SLURMD_NODENAME"):
        argv.append(f"--nodelist={os.environ['SLURMD_NODENAME']}")
    argv += [f"--container-image={c.image}", f"--container-mounts={','.join(mounts)}", f"--container-workdir={run}"]
    if c.env:
        argv.append("--container-env=" + ",".join(c.env))
    return argv


def container_env(config: ConfigSchema) -> dict[str, str]:
    """What the worker's environment adds for its container: under pyxis, container.env (its values
    off the command line); the other runtimes take them as --env arguments."""
    c = _container(config)
    if not c or c.runtime != PYXIS:
        return {}
    return {name: str(value) for name, value in c.env.items()}


def tool_finder(prefix: list[str]) -> Callable[[str, str | None], str | None]:
    """nsight_commands.find_tool for a worker that runs in the container `prefix` starts. Profilers wrap the
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


def check_container(config: ConfigSchema) -> None:
    """Fail before any GPU time when the runtime or the image is missing on this node."""
    c = _container(config)
    if not c:
        return
    image = str(c.image)
    if c.runtime == PYXIS:
        _check_pyxis(image)
        return
    if "://" not in image and not Path(image).exists():
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


def _check_pyxis(image: str) -> None:
    # pyxis takes a registry image (nvcr.io#nvidia/nemo:25.09, ubuntu:24.04) or an enroot squashfs file.
    if (image.startswith(("/", ".")) or image.endswith(".sqsh")) and not Path(image).exists():
        raise ConfigError(
            f"container.image={image}: no such file on this node; accepted with container.runtime=pyxis: "
            "an enroot .sqsh file or a registry image such as nvcr.io#nvidia/nemo:25.09"
        )
    if shutil.which("srun") is None:
        raise ConfigError(
            "container.runtime=pyxis: runs the worker with `srun --container-image=...` and srun is not on "
            "PATH of this node; accepted here: apptainer, singularity, or a SLURM node with pyxis"
        )


def _container(config: ConfigSchema) -> ContainerSchema | None:
    # Launch profiles that are not ghsweep's (e.g. the plugin's own submitit_slurm) carry no container
    # section: the typed config then holds None for it.
    c = config.container
    return c if c is not None and c.image else None
