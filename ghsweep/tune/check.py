"""The tuning study's settings, search space and storage, checked before the sweep records anything.

Hydra calls the sweep's callbacks before it makes the sweeper, and ghsweep's own callback creates the
sweep's MLflow run: this one, listed first by `hydra/sweeper=tune`, refuses a study that cannot run
in one line while nothing is recorded yet.
"""

from __future__ import annotations

from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ghsweep.core.errors import SpaceError, TuneConfigError
from ghsweep.tune.settings import TuneSettings
from ghsweep.tune.space import SearchSpace
from ghsweep.tune.study import storage_damage


def search_space(params: dict[str, str], arguments: list[str]) -> SearchSpace:
    """The study's search space: a preset's `hydra.sweeper.params`, then the command line's overrides."""
    return SearchSpace.parse(OverridesParser.create(), [f"{k}={v}" for k, v in params.items()] + arguments)


class TuneCheckCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            settings = TuneSettings.from_config(config.tune)
            search_space(dict(config.hydra.sweeper.params or {}), list(config.hydra.overrides.task))
            damage = None if config.dry_run else storage_damage(settings.storage, config.hydra.runtime.cwd)
        except (TuneConfigError, SpaceError) as exc:
            damage = str(exc)
        if damage:
            # SystemExit: Hydra turns a callback's exceptions into warnings and would run the sweep anyway.
            raise SystemExit(f"ghsweep: {damage}; nothing was recorded")
