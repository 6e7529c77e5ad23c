"""`dry_run=true`: what each combination would run, where, and with which SLURM parameters.

The worker command is built by the code the job runs (worker_command, profiler_prefix) from the
profile plans made on the submitting side from the config alone (plans_from_config): what only
the node can decide (a GPU, where nsys is, the kernels an ncu pass picks) is said to be resolved
on the node.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from omegaconf import DictConfig

from ghsweep.launch.container import container_prefix
from ghsweep.launch.worker_process import worker_command
from ghsweep.core.run_plan import World
from ghsweep.launch.world import world_of
from ghsweep.core.run_plan import ProfilePlan
from ghsweep.profile.plan import plans_from_config, profiler_prefix
from ghsweep.tracking import redact
from ghsweep.tracking.mlflow_store import absolute_tracking_uri
from ghsweep.core.errors import ConfigError

# Continuation lines line up with the text after "  worker:  ".
INDENT = " " * 11


def describe(num: int, name: str, run_dir: Path, cfg: DictConfig, launch: str, ranks: str | None = None,
             slurm_ranks: bool = False) -> str:
    """One combination: its run directory, its worker command, how it is launched (and, on several
    GPUs, who starts its ranks) and profiled. `slurm_ranks`: srun starts the ranks (the worker line
    is one task's); else torchrun in the worker line starts them on this machine."""
    lines = [f"#{num} {name}", f"  run dir: {run_dir}"]
    try:
        world = world_of(cfg)
        local_ranks = 1 if slurm_ranks else world.gpus_per_node
        plans = plans_from_config(cfg.profile, str(cfg.device), container_prefix(cfg, run_dir))
        commands = [shlex.join(worker_command(cfg, run_dir, profiler_prefix(cfg, run_dir, p), local_ranks))
                    for p in plans]
    except ConfigError as exc:
        world, plans, commands = None, [], [f"(not runnable) {exc}"]
    lines += [f"  worker:  {commands[0]}", f"  launch:  {launch}"]
    if world and world.size > 1:
        lines.append(f"  ranks:   {ranks or local_ranks_text(world)}")
    if plans:
        lines.append(f"  profile: {profile_text(cfg, run_dir, plans)}")
    if len(commands) > 1:
        # profile=auto: the node's other choice, as the job would run it.
        lines.append(f"{INDENT}{commands[1]}")
    # Where the sweep's parent run and this run would be recorded (the sweep manifest's URI).
    lines.append(f"  mlflow:  {absolute_tracking_uri(cfg.tracking.uri, Path.cwd())} "
                 f"(experiment {cfg.tracking.experiment})")
    if cfg.backend.name == "nemo":
        # Imported only here: composing a NeMo recipe needs NeMo in this interpreter.
        from ghsweep.train.nemo.recipe import describe_recipe

        lines.append(describe_recipe(cfg, run_dir))
    if cfg.backend.name == "automodel":
        from ghsweep.train.automodel.config import describe_recipe as describe_automodel_recipe

        lines.append(describe_automodel_recipe(cfg, run_dir))
    return redact.text("\n".join(lines))


def local_ranks_text(world: World) -> str | None:
    """The ranks line of a run on several GPUs of this machine (torchrun, in the worker line)."""
    if world.size == 1:
        return None
    return (f"{world.gpus_per_node} ranks on this machine, one per GPU, started by torch.distributed.run (torchrun) "
            "in the worker line")


def profile_text(cfg: DictConfig, run_dir: Path, plans: list[ProfilePlan]) -> str:
    """The profile line of a dry run: which profiler, over which steps, and what the node decides."""
    steps = f"steps {cfg.capture.start_step}-{cfg.capture.start_step + cfg.capture.num_steps - 1}"
    plan = plans[0]
    if plan.used == "none":
        return "none"
    if plan.used == "torch":
        why = f" (no GPU in this run, device={cfg.device})" if plan.requested == "auto" else ""
        return f"{plan.requested}: the PyTorch profiler inside the worker, {steps}{why}"
    if plan.requested == "auto":
        return (f"auto, resolved on the node: Nsight Systems over {steps} (the worker line above) where the node has a GPU "
                f"and nsys {where('nsys', cfg.profile.nsys.path, plan)}; otherwise the PyTorch profiler inside "
                "the worker, which then runs as")
    text = f"{plan.requested}: Nsight Systems over {steps}; {tool_text('nsys', cfg.profile.nsys.path, plan)}; " \
           "the node needs a GPU, else the run fails before training"
    if plan.ncu:
        text += (f"; then a short second run of the worker in {run_dir / 'ncu_pass'} under ncu in place of nsys "
                 f"(--clock-control none --set {cfg.profile.ncu.section_set}) over one captured step, for the top "
                 f"{cfg.profile.ncu.top_k} kernels of the nsys profile (picked on the node); "
                 f"{tool_text('ncu', cfg.profile.ncu.path, plan)}")
    return text


def tool_text(name: str, configured: str | None, plan: ProfilePlan) -> str:
    """Where the node finds a profiler, marked where the node decides it."""
    if configured:
        return f"{name} {where(name, configured, plan)}"
    return f"{name} resolved on the node {where(name, configured, plan)}"


def where(name: str, configured: str | None, plan: ProfilePlan) -> str:
    assumed = plan.nsys_path if name == "nsys" else plan.ncu_path
    if configured:
        return f"at {assumed} (profile.{name}.path)"
    if plan.tool_prefix:
        return "(inside the container: the first on the image's PATH)"
    found = f"here: {assumed}" if Path(assumed).is_absolute() else f"none on PATH here, so shown as `{name}`"
    return f"(the first on its PATH; {found})"
