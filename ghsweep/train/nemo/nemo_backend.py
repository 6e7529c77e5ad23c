"""backend=nemo: NeMo 2's Llama fine-tuning recipe (recipe.py), trained by nemo_train.py. Light to import:
NeMo and torch load in `train` (and in `describe`, where NeMo imports), so any machine checks a config."""

from __future__ import annotations

from pathlib import Path

from ghsweep.config.schema import ConfigSchema
from ghsweep.core.errors import ConfigError
from ghsweep.core.run_plan import RunPlan
from ghsweep.core.run_summary import RunSummary
from ghsweep.train.backend_protocol import ManagedAllocator
from ghsweep.train.nemo.recipe import check_config, describe_recipe


class NemoBackend:
    name = "nemo"

    def check(self, config: ConfigSchema, on_gpu: bool) -> None:
        # Without a container the worker trains in this interpreter, so its packages can be checked now.
        check_config(config, runtime=not config.container.image)
        if not on_gpu:
            raise ConfigError(
                "backend=nemo: training needs an NVIDIA GPU (Megatron) and this run has none "
                f"(device={config.device}); accepted here: backend=torch"
            )

    def describe(self, config: ConfigSchema, run_dir: Path) -> str:
        return describe_recipe(config, run_dir)

    def train(
        self, config: ConfigSchema, plan: RunPlan, run_dir: Path, managed: ManagedAllocator | None = None
    ) -> RunSummary:
        # The worker's interpreter is the one that trains: the installed packages are checked too.
        check_config(config, runtime=True)
        from ghsweep.train.nemo.nemo_train import train

        return train(config, plan, run_dir, managed)


BACKEND = NemoBackend()
