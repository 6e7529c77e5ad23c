"""Which GPUs a local submitit sweep (hydra/launcher=submitit_local) places its combinations on, and
how many combinations that lets run at once: each combination gets GPUs of its own, as a SLURM
array's jobs get theirs on a cluster, so two combinations never share (and never skew) one GPU.

The sweep takes the GPUs the environment gives it, the convention of CUDA tools: those
CUDA_VISIBLE_DEVICES lists, else every GPU of the machine; CUDA_VISIBLE_DEVICES="" runs every
combination at once on the CPU."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import pynvml
from omegaconf import DictConfig

from ghsweep.config.parallelism import world_of
from ghsweep.config.schema import ConfigSchema
from ghsweep.core.gpu import visible_gpu_handles

log = logging.getLogger(__name__)

LOCAL_LAUNCHER = "hydra_plugins.ghsweep_launcher.ghsweep_launcher.LocalLauncher"
# hydra/launcher=local: one combination after another, in the sweep's process.
ONE_AT_A_TIME_LAUNCHER = "hydra_plugins.ghsweep_launcher.ghsweep_launcher.BasicLauncher"


def sweep_gpus() -> list[int]:
    """The GPUs (CUDA indices, as a job's CUDA_VISIBLE_DEVICES gives them) this sweep places on: those
    CUDA_VISIBLE_DEVICES lists, as given; unset, every GPU of the machine less those another process
    computes on (all of them when every one is busy). Empty without GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        listed = [v.strip() for v in visible.split(",") if v.strip()]
        if all(v.isdigit() for v in listed):
            # As given, also where NVML cannot say more (a container without the driver's library).
            return [int(v) for v in listed]
        return [pynvml.nvmlDeviceGetIndex(h) for h in visible_gpu_handles()]  # UUIDs: their NVML indices
    handles = visible_gpu_handles()
    busy = [i for i, h in enumerate(handles) if _in_use(h)]
    free = [i for i in range(len(handles)) if i not in busy]
    if busy and free:
        log.warning("GPU(s) %s run another process's work: the sweep leaves them out", busy)
        return free
    if busy:
        log.warning("every GPU (%s) runs another process's work: the sweep's timings share them", busy)
    return list(range(len(handles)))


def placed_gpus(config: DictConfig) -> list[int]:
    """The GPUs a sweep places its combinations on: sweep_gpus for the submitit_local launcher; none
    for a launcher that runs one combination at a time (local) or leaves placing to SLURM."""
    return sweep_gpus() if config.hydra.launcher._target_ == LOCAL_LAUNCHER else []


def several_gpus_hint(config: DictConfig, combinations: int) -> str | None:
    """A line for a sweep of several combinations run one at a time on a machine with several free
    GPUs: submitit_local would run one per GPU at once. None otherwise."""
    if config.hydra.launcher._target_ != ONE_AT_A_TIME_LAUNCHER or combinations < 2:
        return None
    gpus = sweep_gpus()
    if len(gpus) < 2:
        return None
    return (
        f"{combinations} combinations run one after another on this machine's first GPU; "
        f"hydra/launcher=submitit_local runs one per GPU at once on GPUs {','.join(map(str, gpus))}"
    )


def too_few_gpus(config: ConfigSchema, gpus: Sequence[int]) -> str | None:
    """Why a sweep placing its combinations on `gpus` cannot place this one, or None."""
    world = world_of(config)
    if not gpus or world.size <= len(gpus):
        return None
    return (
        f"backend.gpus_per_node={world.gpus_per_node}: needs {world.size} GPUs and the sweep has GPUs "
        f"{list(gpus)} (CUDA_VISIBLE_DEVICES); accepted: backend.gpus_per_node <= {len(gpus)}, or more GPUs"
    )


def gpu_sets(gpus: Sequence[int], per_combination: int) -> list[tuple[int, ...]]:
    """`gpus` cut into sets of `per_combination`, one per combination running at once (a remainder
    too small for a combination stays idle)."""
    count = len(gpus) // per_combination
    return [tuple(gpus[i * per_combination : (i + 1) * per_combination]) for i in range(count)]


def _in_use(handle: object) -> bool:
    """Another process computes on the GPU (this one's own CUDA context, a test's, does not count)."""
    try:
        return any(p.pid != os.getpid() for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except pynvml.NVMLError:  # not supported (some MIG and vGPU set-ups): taken as free
        return False
