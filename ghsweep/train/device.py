"""The device a worker trains on: its name, its UUID and the peak memory a run needed there."""

from __future__ import annotations

import platform
import resource
from pathlib import Path

import torch


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return "cpu: " + line.split(":", 1)[1].strip()
    return "cpu: " + (platform.processor() or platform.machine())


def device_uuid(device: torch.device) -> str | None:
    """The GPU's UUID as nvidia-smi prints it (GPU-...): which card measured a run, where the name
    alone cannot tell two of a node's GPUs, or two machines', apart. None on a CPU."""
    if device.type != "cuda":
        return None
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory the run needed: allocated device memory on a GPU, resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux
