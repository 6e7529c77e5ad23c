"""Which profiler a run gets and the worker's profiler prefix (what happens after the worker:
pipeline.py).

The plan is decided once in the job (before any GPU time) as part of the run's RunPlan
(run_plan.json), which the worker reads (profile=torch); the job builds the worker command from it.
A profiler that is asked for by name and cannot run here is a ConfigError naming what is missing;
profile=auto records its choice and why (ghsweep.profile_used / ghsweep.profile_note).
A dry run makes the same plans on the submitting side from the config alone (plans_from_config).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from ghsweep.capture import nsight_commands
from ghsweep.config.schema import ConfigSchema, ProfileSchema, carried
from ghsweep.core.errors import ConfigError
from ghsweep.core.gpu import probe_gpu
from ghsweep.core.run_dir import NSYS_RANK_REPORT, NSYS_REPORT
from ghsweep.core.run_plan import ProfilePlan, SessionCapture, World


def resolve(
    profile: ProfileSchema,
    on_gpu: bool,
    device: str,
    find_tool: Callable[[str, str | None], str | None] = nsight_commands.find_tool,
) -> ProfilePlan:
    """The plan for `profile` on this machine; ConfigError when a named profiler cannot run.

    find_tool(name, configured path) looks a profiler up; a dry run passes node_tool.
    """
    name = profile.name
    if name in ("none", "torch"):
        return ProfilePlan(name, name)
    if name == "memory":
        if not on_gpu:
            raise ConfigError(
                f"profile=memory: the CUDA allocator's history needs a GPU and this run has none (device={device}); "
                "accepted here: profile=torch, auto, none"
            )
        return ProfilePlan(name, name)
    nsys_path = carried(profile.nsys, "profile.nsys").path
    where = f"profile.nsys.path={nsys_path}" if nsys_path else "PATH"
    if name == "auto":
        if not on_gpu:
            return ProfilePlan(name, "torch", note=f"auto: no GPU in this run (device={device}), PyTorch profiler")
        nsys = find_tool("nsys", nsys_path)
        if nsys is None:
            return ProfilePlan(name, "torch", note=f"auto: nsys not found on {where}, PyTorch profiler")
        return ProfilePlan(name, "nsys", nsys_path=nsys, note="auto: nsys found and a GPU: Nsight Systems")
    if not on_gpu:
        raise ConfigError(
            f"profile={name}: Nsight Systems traces CUDA and this run has no GPU (device={device}); "
            "accepted here: profile=torch, auto, none"
        )
    nsys = find_tool("nsys", nsys_path)
    if nsys is None:
        raise ConfigError(
            f"profile={name}: nsys not found on {where}; install Nsight Systems or set "
            "profile.nsys.path=/path/to/nsys; accepted here: profile=torch, auto, none"
        )
    plan = ProfilePlan(name, "nsys", nsys_path=nsys)
    ncu = carried(profile.ncu, "profile.ncu")
    if ncu.enabled:
        plan.ncu_path = find_tool("ncu", ncu.path)
        if plan.ncu_path is None:
            where = f"profile.ncu.path={ncu.path}" if ncu.path else "PATH"
            raise ConfigError(
                f"profile={name}: ncu not found on {where}; install Nsight Compute or set "
                "profile.ncu.path=/path/to/ncu; accepted here: profile=nsys, torch, auto, none"
            )
        plan.ncu = True
    return plan


def node_tool(name: str, configured: str | None) -> str:
    """The path a dry run takes for a profiler the node looks up (nsight_commands.find_tool there): the
    configured path, else the one on PATH here, else the bare name (the node's PATH decides)."""
    if configured:
        return str(Path(configured))
    return shutil.which(name) or name


def container_tool(name: str, configured: str | None) -> str:
    """The path a dry run takes for a profiler looked up inside the run's container on the node:
    the configured path as written, else the bare name (the image's PATH decides, not this
    machine's): what the job's lookup in the container (container.tool_finder) keeps."""
    return configured or name


def plans_from_config(profile: ProfileSchema, device: str, tool_prefix: list[str] | None = None) -> list[ProfilePlan]:
    """The plans a run of this config can get on its node, decided on the submitting side from the
    config alone, for a dry run: resolve() as the node runs it, taking profilers as node_tool (or,
    under a container's `tool_prefix`, container_tool) finds them. One plan, except for
    profile=auto on a device that may be a GPU: then the node picks between two, nsys (a GPU and
    nsys there) first, torch second. ConfigError as resolve()."""
    may_use_gpu = device == "auto" or device.startswith("cuda")
    if not may_use_gpu:
        plans = [resolve(profile, on_gpu=False, device=device)]
    else:
        plans = [resolve(profile, on_gpu=True, device=device, find_tool=container_tool if tool_prefix else node_tool)]
        if profile.name == "auto":
            plans.append(resolve(profile, on_gpu=False, device=device))
    for plan in plans:
        plan.tool_prefix = list(tool_prefix or [])
    return plans


def nsys_capture(
    profile: ProfileSchema, memory: str, report: Path, plan: ProfilePlan
) -> nsight_commands.NsysCapture | None:
    """The nsys capture to `report` of a run with this `profile` and `memory.name`, or None when
    `plan` does not use nsys."""
    if plan.used != "nsys":
        return None
    if plan.nsys_path is None:
        raise ConfigError("profile: the plan uses nsys but names no nsys path (resolve() sets one)")
    opts = carried(profile.nsys, "profile.nsys")
    um = memory == "unified" if opts.um_page_faults == "auto" else bool(opts.um_page_faults)
    return nsight_commands.NsysCapture(plan.nsys_path, report, opts.trace, um, opts.extra_args, opts.gpu_metrics)


def run_capture(
    config: ConfigSchema, run_dir: Path, plan: ProfilePlan, world: World
) -> nsight_commands.NsysCapture | None:
    """nsys_capture of the run in `run_dir` over `world` (the plan's). With several ranks each rank
    writes its own report, profile_rank<RANK>.nsys-rep (nsys expands %q{RANK} from the rank's environment)."""
    report = NSYS_REPORT if world.size == 1 else NSYS_RANK_REPORT
    return nsys_capture(config.profile, config.memory.name, run_dir / report, plan)


def profiler_prefix(config: ConfigSchema, run_dir: Path, plan: ProfilePlan, world: World) -> list[str]:
    """`nsys profile ...` when `plan` says nsys, else nothing: what goes between the container (or
    torchrun) and the worker's python (the one builder of the nsys command, for the job and its dry
    run)."""
    nsys = run_capture(config, run_dir, plan, world)
    return nsys.profile_command() if nsys else []


def session_capture(config: ConfigSchema, run_dir: Path, plan: ProfilePlan, world: World) -> SessionCapture | None:
    """The same capture for a worker forked from the pre-imported worker (one rank on this machine),
    or None: `plan` does not use nsys, or an extra argument of profile.nsys.extra_args belongs to
    neither `nsys launch` nor `nsys start`, and only `nsys profile` takes it."""
    nsys = run_capture(config, run_dir, plan, world)
    commands = nsys.session_commands() if nsys else None
    if not commands:
        return None
    # The default backend's loop is the one that speaks the hand-off (train/phases.HandedCollection).
    handoff = carried(config.profile.nsys, "profile.nsys").handoff and config.backend.name == "torch"
    return SessionCapture(*commands, handoff=handoff)


def sweep_session_launch(profile: ProfileSchema, memory: str, device: str) -> list[str]:
    """The `nsys launch ...` a sweep's pre-imported worker starts under, guessed as the sweep starts
    (before any combination is planned) from its config on this machine: that of session_capture for
    a combination of the sweep's own profile, memory and device; [] for none. A combination whose
    plan differs (another profile swept) starts the server again, as a changed environment does."""
    if profile.name not in ("auto", "nsys"):
        return []
    gpu = probe_gpu() if device != "cpu" else None
    try:
        plan = resolve(profile, gpu is not None, device)
    except ConfigError:
        return []  # the combination's own check says why
    nsys = nsys_capture(profile, memory, Path(NSYS_REPORT), plan)
    commands = nsys.session_commands() if nsys else None
    return commands[0] if commands else []
