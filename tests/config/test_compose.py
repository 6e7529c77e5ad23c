"""Every option of every config group composes with the Hydra compose API."""

from __future__ import annotations

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException, MissingConfigException

from tests.support.compose import compose_config, hydra_on_conf
from tests.support.paths import CONF_DIR

KNOB_GROUPS = [
    "peft",
    "precision",
    "offload",
    "memory",
    "dataloader",
    "model",
    "data",
    "backend",
    "profile",
    "tracking",
    "experiment",
]


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", KNOB_GROUPS)
def test_group_options_are_what_hydra_offers(group):
    """The files of conf/GROUP are exactly the options Hydra lists for GROUP (what `--help` shows)."""
    with hydra_on_conf():
        offered = GlobalHydra.instance().config_loader().get_group_options(group)
    assert group_options(group), f"conf/{group} has no options"
    assert sorted(offered) == group_options(group)


@pytest.mark.parametrize("group,option", [(g, o) for g in KNOB_GROUPS for o in group_options(g)])
def test_every_option_composes(group, option):
    cfg = compose_config(f"{group}={option}")
    if group in ("peft", "precision", "memory", "model", "data", "backend", "profile"):
        assert cfg[group].name == option
    assert cfg.model.arch == "llama"


def test_experiment_selects_without_plus():
    cfg = compose_config("experiment=smoke")
    assert cfg.device == "cpu" and cfg.train.max_steps == 20


def test_command_line_group_beats_preset():
    cfg = compose_config("experiment=smoke", "peft=none")
    assert cfg.peft.name == "none"


def test_unknown_option_names_the_choices():
    with pytest.raises((MissingConfigException, ConfigCompositionException)) as err:
        compose_config("precision=fp64")
    assert "fp64" in str(err.value) and "bf16" in str(err.value)


def test_launcher_profiles_compose():
    cfg = compose_config("hydra/launcher=local", hydra=True)
    assert cfg.hydra.launcher._target_.endswith("BasicLauncher")
