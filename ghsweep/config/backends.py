"""The training backends by name, and the few calls every backend answers.

The registry names modules instead of importing them: config validation and the dry run ask a
backend to check a config without loading NeMo or transformers until that backend is chosen. So a
registered module stays light to import (no torch, transformers or NeMo at its top): it imports
what training needs inside `train`. A new backend is one folder with such a module, one line
here, and its config file in conf/backend/.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ghsweep.core.errors import ConfigError

if TYPE_CHECKING:
    from ghsweep.config.schema import ConfigSchema
    from ghsweep.core.run_plan import RunPlan
    from ghsweep.core.summary import RunSummary

# backend=NAME -> the module that defines it (a module-level object BACKEND satisfying Backend).
BACKENDS = {
    "torch": "ghsweep.train.torch_backend",
    "nemo": "ghsweep.train.nemo.backend",
    "automodel": "ghsweep.train.automodel.backend",
}


class ManagedAllocator(Protocol):
    """memory=unified: the managed-memory allocator the worker set up before anything touched CUDA."""

    allocator: str  # its name, recorded as info.unified_allocator

    def peak_gib(self) -> float | None:
        """The most managed memory it held, where it can tell."""


class Backend(Protocol):
    name: str

    def check(self, config: ConfigSchema, on_gpu: bool) -> None:
        """Raise ConfigError naming the key when this backend cannot run `config` (its knobs have met the
        schema's rules); no GPU time spent. `on_gpu`: the run trains on an NVIDIA GPU."""

    def describe(self, config: ConfigSchema, run_dir: Path) -> str:
        """Lines the dry run adds for this backend's own choices (its recipe), "" for none."""

    def train(
        self, config: ConfigSchema, plan: RunPlan, run_dir: Path, managed: ManagedAllocator | None = None
    ) -> RunSummary:
        """Train the combination; rank 0's summary is what the run measured. `managed` is passed
        rather than set up here: the allocator must be swapped before the backend's imports touch CUDA."""


def backend_named(name: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"backend={name}: not a known backend; accepted: {', '.join(BACKENDS)}")
    backend: Backend = importlib.import_module(BACKENDS[name]).BACKEND
    return backend
