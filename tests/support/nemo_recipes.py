"""backend=nemo configs and the NeMo recipes ghsweep builds from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ghsweep.config.schema import ConfigSchema
from ghsweep.train.nemo.recipe import build_recipe, check_config
from tests.support.compose import compose_config, compose_typed


def nemo_config(*overrides: str) -> DictConfig:
    """The config `python -m ghsweep backend=nemo OVERRIDES` composes."""
    return compose_config("backend=nemo", *overrides)


def nemo_typed(*overrides: str) -> ConfigSchema:
    """The typed config the backend reads for `python -m ghsweep backend=nemo OVERRIDES`."""
    return compose_typed("backend=nemo", *overrides)


def recipe_of(run_dir: Path, *overrides: str) -> tuple[Any, ConfigSchema]:
    """(the NeMo recipe, checked without a GPU, the config it was built from) of backend=nemo OVERRIDES."""
    config = nemo_typed(*overrides)
    check_config(config, runtime=False)
    return build_recipe(config, run_dir), config
