"""`python -m ghsweep [overrides]` runs one combination; `python -m ghsweep -m ...` sweeps them."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

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
    main()
