"""backend=torch: ghsweep's own PyTorch loop (torch_train.py). Light to import: torch, transformers
and peft load in `train`, so the submitting process can ask this backend about a config."""

from __future__ import annotations

from pathlib import Path

from ghsweep.config.schema import ConfigSchema
from ghsweep.core.run_plan import RunPlan
from ghsweep.core.run_summary import RunSummary
from ghsweep.train.backend_protocol import ManagedAllocator


class TorchBackend:
    name = "torch"

    def check(self, config: ConfigSchema, on_gpu: bool) -> None:
        """Nothing of its own: the torch backend's keys are the common ones ghsweep.config checks."""

    def describe(self, config: ConfigSchema, run_dir: Path) -> str:
        return ""

    def train(
        self, config: ConfigSchema, plan: RunPlan, run_dir: Path, managed: ManagedAllocator | None = None
    ) -> RunSummary:
        from ghsweep.train.torch_train import train

        return train(config, plan, run_dir, managed)


BACKEND = TorchBackend()
