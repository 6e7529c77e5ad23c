"""Stand-ins for programs and facts this machine lacks (a container runtime, the Nsight tools, a node's
GPU)."""

from __future__ import annotations

from pathlib import Path

from ghsweep.core.gpu import GpuInfo

# No container runtime is installed here: this stands in for `singularity exec [--nv] [--bind B]...
# [--env K=V]... IMAGE CMD...`, running CMD on this machine with the image's tools (IMAGE.bin/) first
# on PATH, so the job's lookup inside the container really runs a command through the prefix.
FAKE_RUNTIME = """#!/bin/sh
shift
while [ $# -gt 0 ]; do case "$1" in --nv) shift;; --bind|--env) shift 2;; *) break;; esac; done
image=$1; shift
PATH="$image.bin:$PATH" exec "$@"
"""


def fake_runtime(directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / "singularity"
    path.write_text(FAKE_RUNTIME)
    path.chmod(0o755)
    return path


def tool(directory: Path, name: str) -> Path:
    """An executable standing in for an installed nsys/ncu (nothing runs it in a dry run)."""
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


# A node's GPU as nvidia-smi reports it (ghsweep.core.gpu.probe_gpu): what the job plans with on a GPU node.
NODE_GPU = GpuInfo("NVIDIA H200", (9, 0), 139.8, 139.0, 1)
