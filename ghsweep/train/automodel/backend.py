"""backend=automodel: NeMo AutoModel's LLM fine-tuning recipe (config.py), trained by train.py. Light
to import: AutoModel and torch load in `train` (and torch in `describe`), so any machine checks a config."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from ghsweep.config.backends import ManagedAllocator
from ghsweep.core.errors import ConfigError
from ghsweep.core.run_dir import AUTOMODEL_RECIPE
from ghsweep.core.run_plan import RunPlan
from ghsweep.core.summary import RunSummary
from ghsweep.train.automodel.checks import check_config


class AutoModelBackend:
    name = "automodel"

    def check(self, cfg: DictConfig, on_gpu: bool) -> None:
        check_config(cfg)
        if not on_gpu:
            raise ConfigError(
                f"backend=automodel: training needs an NVIDIA GPU (FSDP2 over NCCL) and this run has none "
                f"(device={cfg.device}); accepted here: backend=torch"
            )

    def describe(self, cfg: DictConfig, run_dir: Path) -> str:
        """The recipe config the run would train with (on a GPU)."""
        try:
            check_config(cfg)
        except ConfigError as exc:
            return f"  recipe:  (not runnable) {exc}"
        import yaml

        from ghsweep.train.automodel.config import recipe_config

        text = yaml.safe_dump(recipe_config(cfg, run_dir, "cuda"), sort_keys=False)
        recipe = run_dir / AUTOMODEL_RECIPE
        return f"  recipe:  AutoModel TrainFinetuneRecipeForNextTokenPrediction, {recipe}\n" + "\n".join(
            "    " + line for line in text.splitlines()
        )

    def train(
        self, cfg: DictConfig, plan: RunPlan, run_dir: Path, managed: ManagedAllocator | None = None
    ) -> RunSummary:
        check_config(cfg)
        from ghsweep.train.automodel.train import train

        return train(cfg, plan, run_dir, managed)


BACKEND = AutoModelBackend()
