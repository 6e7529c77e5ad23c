"""The keys and group options the shipped config defines, for refusing a typo before Hydra composes.

Hydra refuses an unknown key with a hint to append it (`+train.max_step=3`), which it then accepts
and nothing reads. Here every key any YAML of conf/ (groups, presets, launch profiles) defines is
known, so a key that is not can be refused with the closest known one.
"""

from __future__ import annotations

import difflib
import os
from functools import cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
GLOBAL_PACKAGE = "# @package _global_"


@cache
def known_keys() -> dict[str, bool]:
    """Every dotted key of conf/ (sections too), with whether it is a map the user fills (a YAML gives
    it as `{}`: `container.env`, `tune.max`); the `hydra` tree is Hydra's to check."""
    keys: dict[str, bool] = {}
    for path in _yaml_files():
        group = path.parent.relative_to(CONF_DIR).as_posix()
        first_line = path.read_text().split("\n", 1)[0].strip()
        package = "" if group == "." or first_line == GLOBAL_PACKAGE else group.replace("/", ".")
        node = OmegaConf.load(path)
        assert isinstance(node, DictConfig), f"{path}: a config file holds a mapping"
        node.pop("defaults", None)  # a group's own defaults list, not a key
        _collect(node, package, keys)
    return {k: v for k, v in keys.items() if k != "hydra" and not k.startswith("hydra.")}


def _yaml_files() -> list[Path]:
    """conf/'s YAML files, through its links (experiment -> experiments/, hydra/launcher -> launchers/)."""
    return sorted(
        Path(folder) / name
        for folder, _, names in os.walk(CONF_DIR, followlinks=True)
        for name in names
        if name.endswith(".yaml")
    )


def _collect(node: DictConfig, prefix: str, keys: dict[str, bool]) -> None:
    for name in map(str, node.keys()):
        key = f"{prefix}.{name}" if prefix else name
        value = node._get_node(name)
        keys[key] = keys.get(key, False) or (isinstance(value, DictConfig) and not value)
        if isinstance(value, DictConfig):
            _collect(value, key, keys)


def is_open(key: str) -> bool:
    """Whether `key` lies in a map the user fills (`container.env.NAME`, `tune.max.METRIC`)."""
    parts = key.split(".")
    return any(known_keys().get(".".join(parts[:end]), False) for end in range(1, len(parts)))


def is_known(key: str) -> bool:
    return key in known_keys() or is_open(key)


def sections() -> set[str]:
    """The top-level sections conf/ defines (train, model, ...)."""
    return {k.split(".", 1)[0] for k in known_keys()}


def closest(word: str, candidates: list[str], cutoff: float = 0.6) -> str | None:
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(key: str, value: str | None = None) -> str:
    """`; did you mean KEY?` for the closest known key or config group (`precision=bf16` for
    `precison=bf16`, with the value given), else where the keys are listed."""
    match = closest(key, sorted({*known_keys(), *groups()}))
    if match in groups() and value is not None:
        return f"; did you mean {match}={value}?"
    if match:
        return f"; did you mean {match}?"
    return "; `python -m ghsweep --cfg job` lists the keys"


@cache
def groups() -> list[str]:
    """The config groups conf/ defines (precision, peft, ...; hydra/launcher, hydra/sweeper)."""
    found = [p.relative_to(CONF_DIR).as_posix() for p in sorted(CONF_DIR.glob("*")) if options(p.name)]
    return found + [f"hydra/{p.name}" for p in sorted((CONF_DIR / "hydra").glob("*")) if options(f"hydra/{p.name}")]


def options(group: str) -> list[str]:
    """The options of a config group (`precision`, `hydra/launcher`), empty for a name that is no group."""
    folder = CONF_DIR / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
