"""Every combination of a grid sweep, checked from the config alone before anything is recorded.

A value no node can run (a bad type or range, fp8 on device=cpu) would otherwise be found by each
job in turn, after the sweep's MLflow run and the jobs before it. Composing every combination here
as the launcher will (Hydra's config loader, the basic sweeper's grid) finds them all at once.

Each combination is then composed once: Hydra's basic sweeper composes every combination again to
check it, and its launcher a third time to run it, each the same compose of the same inputs (0.3 s
a combination on a 2-core machine). The loader Hydra hands both (ComposedOnce) answers them with a
copy of the composition made here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, cast

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_loader import ConfigLoader
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import InterpolationValidationError

from ghsweep.core.errors import ConfigError, one_line
from ghsweep.launch.local_gpus import placed_gpus, too_few_gpus
from ghsweep.launch.run_planner import dry_run_plans
from ghsweep.tracking import redact

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def combinations(config: DictConfig) -> list[list[str]] | None:
    """The overrides of each combination of a grid sweep, in job order (its preset's
    hydra.sweeper.params, then the command line, as the basic sweeper takes them); None for a
    sweeper that picks combinations as it goes (tune)."""
    if config.hydra.sweeper._target_ != BASIC_SWEEPER:
        return None
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    parsed = OverridesParser.create().parse_overrides([*params, *config.hydra.overrides.task])
    return [list(combo) for batch in BasicSweeper.split_arguments(parsed, None) for combo in batch]


def sweep_refusals(config: DictConfig) -> tuple[int, list[str]]:
    """(the number of combinations, one line for each that no node can run: `#N name: reason`)."""
    combos = combinations(config)
    if combos is None:
        return 0, []
    loader = GlobalHydra.instance().config_loader()
    composed: dict[tuple[str, ...], DictConfig] = {}
    gpus = placed_gpus(config)
    lines = []
    run_dirs: dict[Path, int] = {}
    for num, overrides in enumerate(combos):
        try:
            cfg = composed[tuple(overrides)] = loader.load_sweep_config(config, overrides)
            name = redact.run_name(cfg.hydra.job.override_dirname or "run")
            run_dir = sweep_run_dir(cfg, num)
            shared = run_dirs.setdefault(run_dir, num)
            if shared != num:
                raise ConfigError(
                    f"hydra.sweep.subdir={raw_subdir(cfg)}: gives it the run directory of #{shared} ({run_dir}); "
                    "each combination needs its own: name it by what tells them apart, or leave the default "
                    "${hydra.job.num}"
                )
            _, combination = dry_run_plans(cfg, run_dir, name, redact.overrides(overrides), on_slurm=False)
            reason = too_few_gpus(combination, gpus)
        except ConfigError as exc:  # no node can run it (launch.run_planner.not_runnable)
            reason = str(exc)
        except Exception as exc:  # a combination Hydra cannot compose: the launcher would stop on it
            reason, name = one_line(exc), " ".join(redact.overrides(overrides))
        if reason:
            lines.append(redact.text(f"#{num} {name}: {reason}"))
    compose_once(config, composed)
    return len(combos), lines


def raw_subdir(cfg: DictConfig) -> str:
    """hydra.sweep.subdir as written, its interpolations unresolved."""
    return str(cfg.hydra.sweep._get_node("subdir")._value())


def sweep_run_dir(cfg: DictConfig, num: int) -> Path:
    """The run directory Hydra will make for combination `num` (hydra.sweep.dir/hydra.sweep.subdir);
    ConfigError for a subdir that is not a directory name inside the sweep directory."""
    with open_dict(cfg):  # as the launcher sets them before it makes the directory
        cfg.hydra.job.num = cfg.hydra.job.id = num
    raw = raw_subdir(cfg)
    accepted = "accepted: a name made of values, e.g. ${hydra.job.num} (the default) or ${precision.name}"
    try:
        subdir = OmegaConf.select(cfg, "hydra.sweep.subdir", throw_on_missing=True)
    except InterpolationValidationError:  # a node in a string: its text is no directory name
        subdir = cfg.hydra.sweep
    except Exception as exc:
        raise ConfigError(f"hydra.sweep.subdir={raw}: cannot be resolved ({one_line(exc)}); {accepted}") from None
    if OmegaConf.is_config(subdir) or subdir is None or str(subdir).strip() in ("", "."):
        shown = "a config node" if OmegaConf.is_config(subdir) else "nothing"
        raise ConfigError(f"hydra.sweep.subdir={raw}: resolves to {shown}, not a directory name; {accepted}")
    path = Path(str(subdir))
    if path.is_absolute() or ".." in path.parts:
        raise ConfigError(f"hydra.sweep.subdir={raw}: {path} is not inside hydra.sweep.dir; {accepted}")
    return Path(str(cfg.hydra.sweep.dir), path)


class ComposedOnce:
    """A Hydra config loader that answers `load_sweep_config(master, overrides)` for the combinations
    already composed from `master` with a copy of that composition (the launcher writes into its
    config), and leaves everything else to Hydra's loader."""

    def __init__(self, loader: ConfigLoader, master: DictConfig, composed: dict[tuple[str, ...], DictConfig]) -> None:
        self.loader = loader
        self.master = master
        self.composed = composed

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        cfg = self.composed.get(tuple(sweep_overrides)) if master_config is self.master else None
        if cfg is None:
            return self.loader.load_sweep_config(master_config, sweep_overrides)
        return copy.deepcopy(cfg)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet: an instance being unpickled
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __reduce__(self) -> tuple[Any, tuple[ConfigLoader]]:
        # Pickled into a submitit job (with the launcher), it is Hydra's own loader: the job composes its
        # combination itself, on its node, and the sweep's compositions would only weigh down each job.
        return _unwrapped, (self.loader,)


def _unwrapped(loader: ConfigLoader) -> ConfigLoader:
    return loader


def compose_once(master: DictConfig, composed: dict[tuple[str, ...], DictConfig]) -> None:
    """Hand the sweeper and launcher that Hydra makes next (after the callbacks' on_multirun_start) a
    loader that reuses `composed`, the compositions of this sweep's combinations."""
    hydra = GlobalHydra.instance().hydra
    assert hydra is not None  # a sweep runs inside Hydra
    loader = hydra.config_loader
    if isinstance(loader, ComposedOnce):  # a sweep before this one in the same process
        loader = loader.loader
    # Not a ConfigLoader subclass: it delegates what it does not answer itself (__getattr__).
    hydra.config_loader = cast(ConfigLoader, ComposedOnce(loader, master, composed))
