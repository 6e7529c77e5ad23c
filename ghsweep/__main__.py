"""`python -m ghsweep [overrides]` runs one combination; `python -m ghsweep -m ...` sweeps them."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from ghsweep.launch import interrupts
from ghsweep.launch.callbacks import SweepCallback, finish_sweep
from ghsweep.launch.job import run_one


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    result = run_one(cfg)
    if result.status not in ("FINISHED", "DRY_RUN") and HydraConfig.get().mode == RunMode.RUN:
        raise SystemExit(f"ghsweep: run failed: {result.error}")
    return result.__dict__


if __name__ == "__main__":
    interrupts.raise_on_sigterm()
    try:
        main()
    except KeyboardInterrupt as interrupt:  # the run in progress has recorded itself KILLED
        if SweepCallback.started_sweep_dir is None:
            print(f"ghsweep: {interrupts.reason(interrupt)}", file=sys.stderr)
            raise SystemExit(interrupts.exit_status(interrupt)) from None
        finish_sweep(SweepCallback.started_sweep_dir, interrupt)
