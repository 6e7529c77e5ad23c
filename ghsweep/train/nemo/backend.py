"""backend=nemo: NeMo 2's Llama fine-tuning recipe (recipe.py), trained by train.py. Light to import:
NeMo and torch load in `train` (and in `describe`, where NeMo imports), so any machine checks a config."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ghsweep.config.backends import ManagedAllocator
from ghsweep.core.errors import ConfigError
from ghsweep.core.run_plan import RunPlan
from ghsweep.core.summary import RunSummary
from ghsweep.train.nemo.recipe import check_config, describe_recipe


class NemoBackend:
    name = "nemo"

    def check(self, cfg: DictConfig, on_gpu: bool) -> None:
        # Without a container the worker trains in this interpreter, so its packages can be checked now.
        check_config(cfg, runtime=not OmegaConf.select(cfg, "container.image"))
        if not on_gpu:
            raise ConfigError(
                f"backend=nemo: training needs an NVIDIA GPU (Megatron) and this run has none (device={cfg.device}); "
                "accepted here: backend=torch"
            )

    def describe(self, cfg: DictConfig, run_dir: Path) -> str:
        return describe_recipe(cfg, run_dir)

    def train(
        self, cfg: DictConfig, plan: RunPlan, run_dir: Path, managed: ManagedAllocator | None = None
    ) -> RunSummary:
        # The worker's interpreter is the one that trains: the installed packages are checked too.
        check_config(cfg, runtime=True)
        from ghsweep.train.nemo.train import train

        return train(cfg, plan, run_dir, managed)


BACKEND = NemoBackend()
