"""What every training backend answers (`Backend`), and the managed-memory allocator the worker hands it.

A backend's light module (the one ghsweep.train.backends registers) imports this for its types; the
registry itself lives apart so that the backends and it do not import each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ghsweep.config.schema import ConfigSchema
    from ghsweep.core.run_plan import RunPlan
    from ghsweep.core.run_summary import RunSummary


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
