"""The facts about a node's GPU that validation, planning and reports read, asked of nvidia-smi so
the asking process (the job, or the worker before it sets up CUDA) never creates a CUDA context."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: tuple[int, int]
    total_mem_gib: float
    free_mem_gib: float
    # GPUs visible to the run (CUDA_VISIBLE_DEVICES, else all): what a local launch may give one combination.
    count: int = 1


def probe_gpu() -> GpuInfo | None:
    """The first GPU visible to this process (with the number visible), or None when there is no
    usable NVIDIA GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "NoDevFiles"):
        return None
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    cmd = [smi, "--query-gpu=name,compute_cap,memory.total,memory.free", "--format=csv,noheader,nounits"]
    wanted = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
    if wanted:
        cmd += ["-i", ",".join(wanted)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    lines = out.strip().splitlines()
    first = lines[0] if lines else ""
    fields = [f.strip() for f in first.split(",")]
    if len(fields) != 4:
        return None
    name, cc, total_mib, free_mib = fields
    major, _, minor = cc.partition(".")
    return GpuInfo(name, (int(major), int(minor or 0)), float(total_mib) / 1024, float(free_mib) / 1024, len(lines))
