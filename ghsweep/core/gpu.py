"""The facts about a node's GPU that validation, planning and reports read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: tuple[int, int]
    total_mem_gib: float
    free_mem_gib: float
    # GPUs visible to the run (CUDA_VISIBLE_DEVICES, else all): what a local launch may give one combination.
    count: int = 1

