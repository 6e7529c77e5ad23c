"""Where torch.compile keeps what it compiled: one folder a sweep's workers share, on every node.

Inductor keeps its FX graph cache, AOTAutograd's cache and Triton's kernels under
TORCHINDUCTOR_CACHE_DIR (Triton's under it unless TRITON_CACHE_DIR is set); torch reads the variable
each time it looks a graph up, so a worker sets it before its first compile, forked from the
pre-imported worker or not. In a folder the nodes share (train.compile_cache_dir; by default next to
the sweeps, in the directory they are launched from) a graph one combination compiled is loaded by
every later one, on any node and in later sweeps. The folder is keyed by torch, Triton and the device:
a cache made by another torch, Triton or GPU sits beside it unused, and the worker that starts the new
key says so once.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from pathlib import Path

import torch

from ghsweep.core.gpu import GpuInfo

ENV = "TORCHINDUCTOR_CACHE_DIR"


def cache_key(gpu: GpuInfo | None) -> str:
    """The folder name of this torch, Triton and device: a cache made under any other is not this one's."""
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "none"
    device = f"{gpu.name}-sm{gpu.compute_capability[0]}{gpu.compute_capability[1]}" if gpu else "cpu"
    return re.sub(r"[^A-Za-z0-9.+_-]", "-", f"torch-{torch.__version__}_triton-{triton}_{device}")


def use_compile_cache(root: str | None, gpu: GpuInfo | None) -> Path | None:
    """Point torch.compile's caches at `root`'s folder for this torch, Triton and device (made here if
    new); the folder, or None for root None (the environment's TORCHINDUCTOR_CACHE_DIR or torch's own
    default, one per machine)."""
    if root is None:
        return None
    folder = Path(root).absolute() / cache_key(gpu)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir()
    except FileExistsError:
        pass
    else:  # this worker started the key: the only one to say what the folder held before
        others = sorted(p.name for p in folder.parent.iterdir() if p.is_dir() and p != folder)
        if others:
            print(
                f"train.compile_cache_dir {folder.parent}: its caches of another torch, Triton or device "
                f"({', '.join(others)}) are not used; compiling into {folder.name}",
                file=sys.stderr,
            )
    os.environ[ENV] = str(folder)
    # Paths Inductor derived from the folder before (a pre-imported server's imports): as torch's own
    # temporary_cache_dir does on a change of folder.
    inductor_utils = sys.modules.get("torch._inductor.utils")
    if inductor_utils is not None:
        inductor_utils.clear_caches()
    return folder


def cache_counts() -> dict[str, int]:
    """This process's compiled graphs loaded from the caches (hits) and compiled (misses): Inductor's FX
    graph cache and AOTAutograd's, as torch counts them; empty when nothing was compiled."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(dynamo_utils, "counters", None)
    if not counters:
        return {}
    inductor, aot = counters["inductor"], counters["aot_autograd"]
    counts = {
        "compile_fxgraph_cache_hits": inductor["fxgraph_cache_hit"],
        "compile_fxgraph_cache_misses": inductor["fxgraph_cache_miss"],
        "compile_autograd_cache_hits": aot["autograd_cache_hit"],
        "compile_autograd_cache_misses": aot["autograd_cache_miss"],
    }
    return counts if any(counts.values()) else {}
