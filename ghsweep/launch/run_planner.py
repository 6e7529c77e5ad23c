"""One combination's RunPlan, built once: the job builds it on its node (node_plan) and writes it as
run_plan.json for the worker; a dry run builds the plans the node can make from the config alone
(dry_run_plans) and prints them. Both end in assemble_plan, so what a dry run shows is what the job
runs, up to what only the node can decide (a GPU, where the profilers are).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from ghsweep.capture.nsight_commands import find_tool as find_on_node
from ghsweep.capture.profiler_plan import plans_from_config, profiler_prefix, resolve, session_capture
from ghsweep.config.parallelism import data_parallel, world_of
from ghsweep.config.schema import ConfigSchema
from ghsweep.config.validate import run_device, validate
from ghsweep.core.errors import ConfigError
from ghsweep.core.gpu import GpuInfo
from ghsweep.core.run_dir import NCU_PASS_DIR
from ghsweep.core.run_plan import NcuPass, ProfilePlan, RunPlan, World
from ghsweep.launch.container import check_container, container_env, container_prefix, tool_finder
from ghsweep.launch.worker_process import worker_command, worker_program, worker_timeout_min
from ghsweep.launch.world_check import check_world
from ghsweep.train.backends import backend_named

ToolFinder = Callable[[str, str | None], str | None]
# A GPU that meets every requirement a config can state: checking against it, and against no GPU,
# tells what some node could run from what none can.
ANY_GPU = GpuInfo("any GPU", (99, 0), float("inf"), float("inf"), count=1 << 16)


def check_required(cfg: DictConfig) -> None:
    """ConfigError for the first `???` value the command line left unset."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{missing[0]}=???: required and not set; set it on the command line, e.g. {missing[0]}=...")


def check_anywhere(cfg: DictConfig) -> ConfigSchema:
    """The typed config of `cfg`; ConfigError for a config that no node can run, whatever GPU it has or
    lacks: decided from the config alone, before anything is submitted or recorded (the dry run and the
    sweep's start). `cfg` may hold the `hydra` node (a launcher's composed combination): it is left out,
    as Hydra leaves it out of the job's config."""
    if "hydra" in cfg:
        cfg = copy.deepcopy(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
    check_required(cfg)
    device = str(cfg.device)
    nodes = [None] if device == "cpu" else [ANY_GPU] if device.startswith("cuda") else [ANY_GPU, None]
    refused = []
    for gpu in nodes:
        try:
            return checked_config(cfg, gpu)
        except ConfigError as exc:
            refused.append(exc)
    raise refused[-1]


def prune_bar(cfg: DictConfig) -> float | None:
    """The tokens/s a tuning study's trial is pruned below (tune.prune_below_tokens_per_s, which the tune
    sweeper sets for each trial); None outside a study. The tune section is the sweeper's, not the schema's."""
    bar = OmegaConf.select(cfg, "tune.prune_below_tokens_per_s")
    return None if bar is None else float(bar)


def checked_config(cfg: DictConfig, gpu: GpuInfo | None) -> ConfigSchema:
    """The typed config of `cfg` (ghsweep.config.validate), then checked by the backend it chooses for
    what only that backend knows (its own keys, its packages); ConfigError, one line, for the first
    value this run cannot use on a node with `gpu` (None: no GPU). Here and not in train/: the worker
    loads its backend through the registry and must not load validation with it."""
    config = validate(cfg, gpu)
    backend_named(config.backend.name).check(config, run_device(config, gpu) == "cuda")
    return config


def node_plan(
    cfg: DictConfig,
    run_dir: Path,
    name: str,
    overrides: list[str],
    gpu: GpuInfo | None,
    slurm_tasks: int | None,
    find_tool: ToolFinder = find_on_node,
) -> tuple[RunPlan, ConfigSchema]:
    """(the plan on a node with `gpu` (None: no GPU), as a local launch (slurm_tasks None) or a task
    of a SLURM job of `slurm_tasks` tasks; the typed config validation made of `cfg`); ConfigError for
    a run that cannot start there. Every SLURM task of a run makes the same checks, so a config rank 0
    refuses is refused by all ranks before any of them waits for the others. With a container the
    profilers are looked up inside it."""
    config = checked_config(cfg, gpu)
    check_container(config)
    device = run_device(config, gpu)
    on_slurm = slurm_tasks is not None
    world = world_of(config)
    check_world(config, world, device == "cuda", gpu.count if gpu else 0, on_slurm)
    if on_slurm and slurm_tasks != world.size:
        raise ConfigError(
            f"backend.num_nodes x backend.gpus_per_node = {world.size} ranks, but this SLURM job has "
            f"{slurm_tasks} tasks; let ghsweep's launcher set hydra.launcher.nodes and tasks_per_node"
        )
    container = container_prefix(config, run_dir)
    profile = resolve(
        config.profile, device == "cuda", config.device, tool_finder(container) if container else find_tool
    )
    profile.tool_prefix = container
    plan = assemble_plan(
        config,
        run_dir,
        name,
        overrides,
        device,
        gpu,
        world,
        container,
        profile,
        on_slurm and world.size > 1,
        prune_bar(cfg),
    )
    return plan, config


def dry_run_plans(
    cfg: DictConfig, run_dir: Path, name: str, overrides: list[str], on_slurm: bool
) -> tuple[list[RunPlan], ConfigSchema]:
    """(the plans the node can make, decided here from the config alone (capture.profiler_plan.plans_from_config):
    one, or for profile=auto on a device that may be a GPU, the node's choice with a GPU and nsys
    first and without second; the typed config of `cfg`). ConfigError for what no node can run."""
    config = check_anywhere(cfg)
    world = world_of(config)
    may_use_gpu = config.device != "cpu"
    container = container_prefix(config, run_dir)
    profiles = plans_from_config(config.profile, config.device, container)
    devices = ["cuda" if may_use_gpu else "cpu", "cpu"]
    plans = [
        assemble_plan(
            config,
            run_dir,
            name,
            overrides,
            device,
            None,
            world,
            container,
            profile,
            on_slurm and world.size > 1,
            prune_bar(cfg),
        )
        for device, profile in zip(devices, profiles)
    ]
    return plans, config


def not_runnable(cfg: DictConfig, run_dir: Path, name: str, overrides: list[str]) -> str | None:
    """Why no node can run this combination (the dry run's `(not runnable)` reason), or None."""
    try:
        dry_run_plans(cfg, run_dir, name, overrides, on_slurm=False)
    except ConfigError as exc:
        return str(exc)
    return None


def assemble_plan(
    config: ConfigSchema,
    run_dir: Path,
    name: str,
    overrides: list[str],
    device: str,
    gpu: GpuInfo | None,
    world: World,
    container: list[str],
    profile: ProfilePlan,
    srun_ranks: bool,
    prune_below_tokens_per_s: float | None,
) -> RunPlan:
    """The plan from the decisions made (`container`: launch.container.container_prefix of
    `run_dir`); the worker commands, the run's and its ncu pass's, are built here and nowhere else."""
    # Locally torchrun starts the node's ranks; on SLURM srun already started one task per rank.
    local_ranks = 1 if srun_ranks else world.gpus_per_node
    # Inside a container the image's Python runs the worker: the host interpreter's path means nothing there.
    python = config.container.python if container else sys.executable
    profiler = profiler_prefix(config, run_dir, profile, world)
    # A pre-imported worker stands in for the worker alone in this interpreter (no torchrun or
    # container around it); under nsys it runs in an nsys session instead, which records each
    # worker it forks as the command would.
    alone = local_ranks == 1 and not container
    capture = session_capture(config, run_dir, profile, world) if alone else None
    return RunPlan(
        name=name,
        run_dir=str(run_dir),
        overrides=overrides,
        backend=config.backend.name,
        device=device,
        gpu=gpu,
        world=world,
        data_parallel=data_parallel(config),
        profile=profile,
        container_prefix=container,
        worker_command=worker_command(run_dir, container, python, profiler, local_ranks),
        timeout_min=worker_timeout_min(config.worker.timeout_min, device == "cuda"),
        srun_ranks=srun_ranks,
        preimported=config.worker.preimported and alone and (not profiler or capture is not None),
        capture=capture,
        ncu_pass=ncu_pass(config, run_dir, python) if profile.ncu else None,
        prune_below_tokens_per_s=prune_below_tokens_per_s,
        worker_env=container_env(config),
    )


def ncu_pass(config: ConfigSchema, run_dir: Path, python: str) -> NcuPass:
    """The Nsight Compute pass of the run in `run_dir`: its worker in a folder of its own, in the
    run's container (one rank: launch.world_check refuses the pass on several)."""
    work = run_dir / NCU_PASS_DIR
    return NcuPass(str(work), container_prefix(config, work), worker_program(work, python))
