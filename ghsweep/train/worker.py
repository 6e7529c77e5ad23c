"""The worker process: `python -m ghsweep.train.worker RUN_DIR` trains the run described by
RUN_DIR/config.yaml and writes summary.json (or worker_error.json) beside it.

It runs in its own process so that nsys or a container can wrap it, CUDA can be set up before
anything touches it, and a crash cannot take the sweep down.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf
from ghsweep.core.errors import first_line


if TYPE_CHECKING:  # imported for real in load_backend, before anything touches CUDA
    from ghsweep.train.unified_memory import ManagedMemory


def load_backend(cfg: DictConfig) -> tuple[ModuleType, ManagedMemory | None]:
    """(the backend module, the managed-memory allocator with memory=unified, else None).

    The allocator is set up before the backend's imports: transformers initialises CUDA on import,
    and the allocator can only be swapped before that.
    """
    if cfg.backend.name not in ("torch", "nemo", "automodel"):
        raise ValueError(f"backend={cfg.backend.name} is not known; accepted: torch, nemo, automodel")
    from ghsweep.train.unified_memory import setup_unified_memory

    managed = setup_unified_memory(cfg.memory) if cfg.memory.name == "unified" else None
    # Imported only for its backend: the base install has no NeMo.
    if cfg.backend.name == "nemo":
        from ghsweep.train.nemo import backend
    elif cfg.backend.name == "automodel":
        from ghsweep.train.automodel import backend
    else:
        from ghsweep.train import torch_backend as backend
    return backend, managed


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m ghsweep.train.worker RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[1])
    ready_at = time.time()
    cfg = OmegaConf.load(run_dir / "config.yaml")
    try:
        backend, managed = load_backend(cfg)
        import_s = time.time() - ready_at
        summary = backend.train(cfg, run_dir, managed)
    except BaseException as exc:
        rank = os.environ.get("RANK")
        message = first_line(exc) if rank is None else f"rank {rank}: {first_line(exc)}"
        # With several ranks the first to fail explains the run; the others often fail because of it.
        with contextlib.suppress(FileExistsError), open(run_dir / "worker_error.json", "x") as error_file:
            error_file.write(json.dumps({"type": type(exc).__name__, "message": message}))
        traceback.print_exc()
        return 1
    # Rank 0 writes the run's summary (it holds every rank's step times); other ranks only train.
    if int(os.environ.get("RANK", 0)) == 0:
        summary["timing"].update(ready_at=ready_at, import_s=import_s)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
