"""The sweeper `hydra/sweeper=tune` names; Hydra instantiates sweepers only from hydra_plugins.

Hydra imports every module under hydra_plugins at each command's plugin scan (`--help` included),
so Optuna and MLflow are imported when a sweep instantiates this sweeper, as Hydra's own Optuna
sweeper does. Everything it does is in ghsweep.tune.sweeper.
"""

from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class TuneSweeper(Sweeper):
    def __init__(self, params: dict[str, str] | None = None) -> None:
        from ghsweep.tune import sweeper

        self.sweeper = sweeper.TuneSweeper(params)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.sweeper.sweep(arguments)
