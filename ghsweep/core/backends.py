"""The training backends by name, and the few calls every backend answers.

The registry names modules instead of importing them: config validation and the dry run ask a
backend to check a config without loading NeMo or transformers until that backend is chosen.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ghsweep.core.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ghsweep.core.run_plan import RunPlan
    from ghsweep.core.summary import RunSummary

# backend=NAME -> the module that defines it (a module-level object BACKEND satisfying Backend).
BACKENDS = {
    "torch": "ghsweep.train.torch_backend",
    "nemo": "ghsweep.train.nemo.backend",
    "automodel": "ghsweep.train.automodel.backend",
}


class Backend(Protocol):
    name: str

    def check(self, cfg: DictConfig, on_gpu: bool) -> None:
        """Raise ConfigError naming the key when this backend cannot run `cfg`; no GPU time spent."""

    def describe(self, cfg: DictConfig) -> dict[str, str]:
        """What the dry run shows of this backend's choices (recipe, parallelism, ...)."""

    def train(self, cfg: DictConfig, plan: RunPlan, run_dir: Path) -> RunSummary:
        """Train the combination; rank 0's summary is what the run measured."""


def backend_named(name: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"backend={name}: not a known backend; accepted: {', '.join(BACKENDS)}")
    return importlib.import_module(BACKENDS[name]).BACKEND
