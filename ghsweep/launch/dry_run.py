"""`dry_run=true`: what each combination would run, where, and with which SLURM parameters.

Each combination's RunPlans come from the builder the job uses (ghsweep.launch.run_planner), made on the
submitting side from the config alone: what only the node can decide (a GPU, where nsys is, the
kernels an ncu pass picks) is said to be resolved on the node.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from omegaconf import DictConfig

from ghsweep.config.schema import ConfigSchema, capture_steps, carried, typed
from ghsweep.core.errors import ConfigError
from ghsweep.core.run_dir import NCU_PASS_DIR
from ghsweep.core.run_plan import ProfilePlan, RunPlan, World
from ghsweep.launch.run_planner import dry_run_plans
from ghsweep.tracking import redact
from ghsweep.tracking.mlflow_store import absolute_tracking_uri
from ghsweep.train.backends import backend_named

# Continuation lines line up with the text after "  worker:  ".
INDENT = " " * 11


def describe(
    num: int,
    name: str,
    run_dir: Path,
    overrides: list[str],
    cfg: DictConfig,
    launch: str,
    ranks: str | None = None,
    on_slurm: bool = False,
) -> str:
    """One combination: its run directory, its worker command, how it is launched (and, on several
    GPUs, who starts its ranks) and profiled. `on_slurm`: srun starts the ranks (the worker line
    is one task's); else torchrun in the worker line starts them on this machine."""
    lines = [f"#{num} {name}", f"  run dir: {run_dir}"]
    try:
        plans, config = dry_run_plans(cfg, run_dir, name, overrides, on_slurm)
        commands = [shlex.join(plan.worker_command) for plan in plans]
    except ConfigError as exc:
        # Validation refused it and made no typed config: the lines below read the composed config typed
        # unchecked, so that its backend still says what it would refuse itself (NeMo's recipe checks).
        plans, commands, config = [], [f"(not runnable) {exc}"], typed(cfg)
    lines += [f"  worker:  {commands[0]}", f"  launch:  {launch}"]
    if plans and plans[0].world.size > 1:
        lines.append(f"  ranks:   {ranks or local_ranks_text(plans[0].world)}")
    if plans:
        lines.append(f"  profile: {profile_text(config, plans)}")
    if len(commands) > 1:
        # profile=auto: the node's other choice, as the job would run it.
        lines.append(f"{INDENT}{commands[1]}")
    # Where the sweep's parent run and this run would be recorded (the sweep manifest's URI).
    lines.append(
        f"  mlflow:  {absolute_tracking_uri(config.tracking.uri, Path.cwd())} (experiment {config.tracking.experiment})"
    )
    # The backend's own choices (NeMo's recipe, AutoModel's YAML); empty for the torch backend, and for a
    # backend name that is none (the worker line above says it was refused).
    try:
        described = backend_named(config.backend.name).describe(config, run_dir)
    except ConfigError:
        described = ""
    if described:
        lines.append(described)
    return redact.text("\n".join(lines))


def local_ranks_text(world: World) -> str | None:
    """The ranks line of a run on several GPUs of this machine (torchrun, in the worker line)."""
    if world.size == 1:
        return None
    return (
        f"{world.gpus_per_node} ranks on this machine, one per GPU, started by torch.distributed.run (torchrun) "
        "in the worker line"
    )


def profile_text(config: ConfigSchema, plans: list[RunPlan]) -> str:
    """The profile line of a dry run: which profiler, over which steps, and what the node decides."""
    capture = config.capture
    window = capture_steps(capture, config.train.max_steps)
    steps = (
        f"the {capture.num_steps} steps after the measured ones"
        if capture.start_step == "auto"
        else f"steps {window.start}-{window[-1]}"
    )
    plan = plans[0].profile
    if plan.used == "none":
        return "none"
    if plan.used == "memory":
        return f"memory: the CUDA allocator's history over {steps}, dumped as memory_snapshot.pickle"
    if plan.used == "torch":
        why = f" (no GPU in this run, device={config.device})" if plan.requested == "auto" else ""
        return f"{plan.requested}: the PyTorch profiler inside the worker, {steps}{why}"
    nsys_path = carried(config.profile.nsys, "profile.nsys").path
    if plan.requested == "auto":
        return (
            f"auto, resolved on the node: Nsight Systems over {steps} (the worker line above) where the node has a GPU "
            f"and nsys {where('nsys', nsys_path, plan)}; otherwise the PyTorch profiler inside "
            "the worker, which then runs as"
        )
    text = (
        f"{plan.requested}: Nsight Systems over {steps}; {tool_text('nsys', nsys_path, plan)}; "
        "the node needs a GPU, else the run fails before training"
    )
    if plan.ncu:
        ncu = carried(config.profile.ncu, "profile.ncu")
        text += (
            f"; then a short second run of the worker in {Path(plans[0].run_dir) / NCU_PASS_DIR} "
            "under ncu in place of nsys "
            f"(--clock-control none --set {ncu.section_set}) over one captured step, for the top "
            f"{ncu.top_k} kernels of the nsys profile (picked on the node); "
            f"{tool_text('ncu', ncu.path, plan)}"
        )
    return text


def tool_text(name: str, configured: str | None, plan: ProfilePlan) -> str:
    """Where the node finds a profiler, marked where the node decides it."""
    if configured:
        return f"{name} {where(name, configured, plan)}"
    return f"{name} resolved on the node {where(name, configured, plan)}"


def where(name: str, configured: str | None, plan: ProfilePlan) -> str:
    assumed = plan.nsys_path if name == "nsys" else plan.ncu_path
    assert assumed is not None, f"a plan that runs {name} holds its path (ghsweep.capture.profiler_plan.resolve)"
    if configured:
        return f"at {assumed} (profile.{name}.path)"
    if plan.tool_prefix:
        return "(inside the container: the first on the image's PATH)"
    found = f"here: {assumed}" if Path(assumed).is_absolute() else f"none on PATH here, so shown as `{name}`"
    return f"(the first on its PATH; {found})"
