"""backend=automodel: NeMo AutoModel's LLM fine-tuning recipe (config.py), trained by
automodel_train.py. Light to import: AutoModel and torch load in `train` (and torch in `describe`),
so any machine checks a config."""

from __future__ import annotations

from pathlib import Path

from ghsweep.config.schema import ConfigSchema
from ghsweep.core.errors import ConfigError
from ghsweep.core.run_dir import AUTOMODEL_RECIPE
from ghsweep.core.run_plan import RunPlan
from ghsweep.core.run_summary import RunSummary
from ghsweep.train.automodel.checks import check_config
from ghsweep.train.backend_protocol import ManagedAllocator


class AutoModelBackend:
    name = "automodel"

    def check(self, config: ConfigSchema, on_gpu: bool) -> None:
        check_config(config)
        if not on_gpu:
            raise ConfigError(
                f"backend=automodel: training needs an NVIDIA GPU (FSDP2 over NCCL) and this run has none "
                f"(device={config.device}); accepted here: backend=torch"
            )

    def describe(self, config: ConfigSchema, run_dir: Path) -> str:
        """The recipe config the run would train with (on a GPU)."""
        try:
            check_config(config)
        except ConfigError as exc:
            return f"  recipe:  (not runnable) {exc}"
        import yaml

        from ghsweep.train.automodel.config import recipe_config

        text = yaml.safe_dump(recipe_config(config, run_dir, "cuda"), sort_keys=False)
        recipe = run_dir / AUTOMODEL_RECIPE
        return f"  recipe:  AutoModel TrainFinetuneRecipeForNextTokenPrediction, {recipe}\n" + "\n".join(
            "    " + line for line in text.splitlines()
        )

    def train(
        self, config: ConfigSchema, plan: RunPlan, run_dir: Path, managed: ManagedAllocator | None = None
    ) -> RunSummary:
        check_config(config)
        from ghsweep.train.automodel.automodel_train import train

        return train(config, plan, run_dir, managed)


BACKEND = AutoModelBackend()
