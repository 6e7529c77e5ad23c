"""The one way tests compose the repo's config: as `python -m ghsweep OVERRIDES` does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import DictConfig

from ghsweep.config.schema import ConfigSchema, typed
from ghsweep.launch.precheck import sweep_refusals
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


def launch_config(*overrides: str, sweep: bool) -> DictConfig:
    """The config Hydra hands ghsweep's callbacks for `python -m ghsweep [-m] OVERRIDES` (its hydra node
    included); inside hydra_on_conf(), which the sweep's checks (launch.precheck) compose in."""
    hydra = GlobalHydra.instance().hydra
    assert hydra is not None, "call launch_config inside hydra_on_conf()"
    mode = RunMode.MULTIRUN if sweep else RunMode.RUN
    return hydra.compose_config("config", list(overrides), run_mode=mode, with_log_configuration=False)


def refused_combinations(*overrides: str) -> tuple[int, list[str]]:
    """What `python -m ghsweep -m OVERRIDES` checks before its first job (launch.precheck.sweep_refusals):
    (the number of combinations, `#N name: reason` for each that no node can run)."""
    with hydra_on_conf():
        return sweep_refusals(launch_config(*overrides, sweep=True))
