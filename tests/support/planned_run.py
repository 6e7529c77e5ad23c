"""A run directory as the job leaves it for the worker: config.yaml and run_plan.json, for tests that
start `python -m ghsweep.train.worker` themselves."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ghsweep.config.parallelism import data_parallel
from ghsweep.config.schema import typed
from ghsweep.core.gpu import probe_gpu
from ghsweep.core.run_dir import CONFIG
from ghsweep.core.run_plan import ProfilePlan, RunPlan, World
from ghsweep.launch.run_planner import prune_bar


def planned_run(run_dir: Path, cfg: DictConfig, profiler: str = "none") -> RunPlan:
    """Write the composed `cfg` and its plan (one process on this machine, `profiler` used) into `run_dir`;
    a tuning trial's `tune.prune_below_tokens_per_s` goes into the plan, as the job puts it there."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG).write_text(OmegaConf.to_yaml(cfg, resolve=True))
    config = typed(cfg)
    gpu = probe_gpu() if config.device != "cpu" else None
    plan = RunPlan(
        name=run_dir.name,
        run_dir=str(run_dir),
        overrides=[],
        backend=config.backend.name,
        device="cuda" if gpu else "cpu",
        gpu=gpu,
        world=World(),
        data_parallel=data_parallel(config),
        profile=ProfilePlan(requested=profiler, used=profiler),
        container_prefix=[],
        worker_command=[],
        timeout_min=None,
        prune_below_tokens_per_s=prune_bar(cfg),
    )
    plan.save(run_dir)
    return plan
