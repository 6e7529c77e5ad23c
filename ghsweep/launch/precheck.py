"""Every combination of a grid sweep, checked from the config alone before anything is recorded.

A value no node can run (a bad type or range, fp8 on device=cpu) would otherwise be found by each
job in turn, after the sweep's MLflow run and the jobs before it. Composing every combination here
as the launcher will (Hydra's config loader, the basic sweeper's grid) finds them all at once.
"""

from __future__ import annotations

from pathlib import Path

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from ghsweep.core.errors import one_line
from ghsweep.launch.local_gpus import placed_gpus, too_few_gpus
from ghsweep.launch.plan import not_runnable
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
    gpus = placed_gpus(config)
    lines = []
    for num, overrides in enumerate(combos):
        try:
            cfg = loader.load_sweep_config(config, overrides)
            name = redact.run_name(cfg.hydra.job.override_dirname or "run")
            run_dir = Path(str(cfg.hydra.sweep.dir), str(num))
            reason = not_runnable(cfg, run_dir, name, redact.overrides(overrides)) or too_few_gpus(cfg, gpus)
        except Exception as exc:  # a combination Hydra cannot compose: the launcher would stop on it
            reason, name = one_line(exc), " ".join(redact.overrides(overrides))
        if reason:
            lines.append(redact.text(f"#{num} {name}: {reason}"))
    return len(combos), lines
