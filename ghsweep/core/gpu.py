"""The facts about a node's GPU that validation, planning and reports read, asked of NVML (NVIDIA's
management library, through nvidia-ml-py) so the asking process (the job, or the worker before it
sets up CUDA) never creates a CUDA context."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pynvml


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: tuple[int, int]
    total_mem_gib: float
    free_mem_gib: float
    # GPUs visible to the run (CUDA_VISIBLE_DEVICES, else all): what a local launch may give one combination.
    count: int = 1


def nvml_ready() -> bool:
    """Start NVML in this process (once; later calls are cheap); False where there is no NVIDIA driver."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    return True


def visible_gpu_handles() -> list[Any]:
    """NVML handles of the GPUs CUDA shows this process, in CUDA's order: CUDA_VISIBLE_DEVICES lists
    NVML indices or UUIDs (GPU-...); unset, every GPU. Empty without a driver or with CUDA hidden."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if (visible is not None and visible.strip() in ("", "-1", "NoDevFiles")) or not nvml_ready():
        return []
    if visible is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    try:
        return [
            pynvml.nvmlDeviceGetHandleByUUID(v)
            if v.startswith(("GPU-", "MIG-"))
            else pynvml.nvmlDeviceGetHandleByIndex(int(v))
            for v in wanted
        ]
    except (pynvml.NVMLError, ValueError):
        return []


def probe_gpu() -> GpuInfo | None:
    """The first GPU visible to this process (with the number visible), or None when there is no
    usable NVIDIA GPU."""
    handles = visible_gpu_handles()
    if not handles:
        return None
    first = handles[0]
    try:
        name = pynvml.nvmlDeviceGetName(first)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(first)
        memory = pynvml.nvmlDeviceGetMemoryInfo(first)
    except pynvml.NVMLError:
        return None
    return GpuInfo(
        name if isinstance(name, str) else name.decode(),
        (major, minor),
        memory.total / 2**30,
        memory.free / 2**30,
        len(handles),
    )
