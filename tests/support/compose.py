"""The one way tests compose the repo's config: as `python -m ghsweep OVERRIDES` does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from ghsweep.config.schema import ConfigSchema, typed
from tests.support.paths import CONF_DIR

# ghsweep's @hydra.main(version_base=...): composing under another would pick other Hydra defaults.
VERSION_BASE = "1.3"


@contextmanager
def hydra_on_conf() -> Iterator[None]:
    """Hydra initialised on conf/, for what compose does not return (the options of a group)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=VERSION_BASE):
        yield


def compose_config(*overrides: str, hydra: bool = False) -> DictConfig:
    """The config `python -m ghsweep OVERRIDES` composes (with the `hydra` node when `hydra`)."""
    with hydra_on_conf():
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


def compose_typed(*overrides: str) -> ConfigSchema:
    """The typed config the plan, the worker and the backends read for `python -m ghsweep OVERRIDES`."""
    return typed(compose_config(*overrides))
