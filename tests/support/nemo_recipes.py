"""backend=nemo configs and the NeMo recipes ghsweep builds from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ghsweep.train.nemo.recipe import build_recipe, check_config
from tests.support.compose import compose_config


def nemo_config(*overrides: str) -> DictConfig:
    """The config `python -m ghsweep backend=nemo OVERRIDES` composes."""
    return compose_config("backend=nemo", *overrides)


def recipe_of(run_dir: Path, *overrides: str) -> tuple[Any, DictConfig]:
    """(the NeMo recipe, checked without a GPU, the config it was built from) of backend=nemo OVERRIDES."""
    cfg = nemo_config(*overrides)
    check_config(cfg, runtime=False)
    return build_recipe(cfg, run_dir), cfg
