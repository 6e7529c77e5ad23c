"""What happens after a profiled worker: export, the optional Nsight Compute pass, analysis,
report, plots and the files and numbers for MLflow (the plan that led here:
ghsweep.capture.profiler_plan).

It is profile's, not capture's: it starts once the worker's recording is finished, and its work is
reading it. The one recording it makes, the ncu pass, is picked by that reading (the nsys profile's
top kernels) and takes its command line from capture (nsight_commands.ncu_command), a layer below."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from ghsweep.capture.nsight_commands import ncu_command
from ghsweep.config.schema import ConfigSchema, capture_steps, carried
from ghsweep.core.errors import ProfilerUnavailable
from ghsweep.core.names import PROFILE_ERROR_TAG
from ghsweep.core.run_dir import (
    CONFIG,
    GAP_PLOT,
    NCU_CSV,
    NCU_REPORT,
    NSYS_RANK_GLOB,
    NSYS_REPORT,
    ROOFLINE_PLOT,
    TORCH_TRACE,
)
from ghsweep.core.run_plan import ProfilePlan, RunPlan
from ghsweep.profile import profile_plots, profile_report
from ghsweep.profile.analysis import analyze
from ghsweep.profile.nsight_exports import export_sqlite, ncu_raw_csv
from ghsweep.profile.overhead import MeasuredRun
from ghsweep.profile.ranks import rank_of
from ghsweep.profile.run_analysis import full_analysis, rank_analysis

log = logging.getLogger(__name__)

# Runs the ncu pass's worker command (RunPlan.ncu_pass's, under ncu) in the pass's folder; its exit status.
RunNcuPass = Callable[[list[str], Path], int]

# Nsight Compute replays each profiled launch dozens of times (and saves and restores the memory it
# writes): on Llama-2-7B a whole step's ~250 launches ran past 4.5 minutes. A roofline point needs a
# few launches of each top kernel: one per launch configuration, and never more than this in all.
NCU_LAUNCHES_PER_CONFIG = 1
NCU_MAX_LAUNCHES = 64


@dataclass
class ProfileOutcome:
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)


def context_of(config: ConfigSchema) -> dict:
    """What the findings may know about the run's config."""
    return {
        "precision": config.precision.name,
        "offload": config.offload.enabled,
        # The torch backend's knob (Megatron's offloading has its own schedule).
        "offload_prefetch_layers": config.offload.prefetch_layers
        if config.offload.enabled and config.backend.name == "torch"
        else None,
        "memory": config.memory.name,
        "num_workers": config.dataloader.num_workers,
    }


def after_worker(config: ConfigSchema, run: RunPlan, run_ncu_pass: RunNcuPass) -> ProfileOutcome:
    """Export, ncu pass, analysis, report and plots of the finished worker of `run`; never raises
    for a profiling problem (the training result stands): it is recorded as ghsweep.profile_error."""
    run_dir, plan = Path(run.run_dir), run.profile
    outcome = ProfileOutcome(tags={"ghsweep.profile_used": plan.used})
    if plan.note:
        outcome.tags["ghsweep.profile_note"] = plan.note
    if plan.used in ("none", "memory"):  # memory: the snapshot is the record (an artifact of the run)
        return outcome
    try:
        world_size = run.world.size
        raw, profiles = profile_files(run_dir, plan, world_size)
        ncu_csv, ncu_info = None, None
        if plan.ncu:
            ncu_csv, ncu_info = ncu_pass(config, run, profiles[0], run_ncu_pass)
            outcome.metrics["ncu_s"] = ncu_info["seconds"]
            raw.append(ncu_csv)
        measured = MeasuredRun.of(run_dir)  # the worker's untraced steps: the profiler's overhead
        analysis = (
            full_analysis(profiles[0], context_of(config), ncu_csv, measured=measured)
            if world_size == 1 or plan.used != "nsys"
            else rank_analysis(profiles, context_of(config), world_size, measured=measured)
        )
        if ncu_info:
            analysis.roofline["ncu_pass"] = ncu_info
    except (ProfilerUnavailable, OSError, ValueError) as exc:
        log.error("profile analysis failed: %s", exc)
        outcome.tags[PROFILE_ERROR_TAG] = str(exc)[:500]
        return outcome
    outcome.artifacts += [analysis.save(run_dir), *profile_report.write(analysis, run_dir)]
    if analysis.gaps:
        outcome.artifacts.append(profile_plots.gap_histogram(analysis, run_dir / GAP_PLOT))
    if analysis.roofline.get("kernels"):
        outcome.artifacts.append(profile_plots.roofline_plot(analysis.roofline, run_dir / ROOFLINE_PLOT))
    outcome.metrics |= analysis.metrics()
    outcome.tags["ghsweep.findings"] = ",".join(f.id for f in analysis.findings) or "none"
    add_raw_files(outcome, raw, config.profile.artifact_max_mb)
    return outcome


def profile_files(run_dir: Path, plan: ProfilePlan, world_size: int) -> tuple[list[Path], list[Path]]:
    """(the profiler's files to keep, the files the analysis reads): the PyTorch trace, or each
    rank's nsys report and its SQLite export."""
    if plan.used == "nsys":
        nsys = plan.nsys_path
        if nsys is None:
            raise ProfilerUnavailable("the run's plan uses nsys but names no nsys path")
        reports = nsys_reports(run_dir, world_size)
        exports = [export_sqlite(nsys, rep, plan.tool_prefix) for rep in reports]
        return [*reports, *exports], exports
    trace = run_dir / TORCH_TRACE
    if not trace.exists():
        raise ProfilerUnavailable(
            f"the PyTorch profiler wrote no trace ({TORCH_TRACE}): the capture window "
            "(capture.start_step, capture.num_steps) never ran"
        )
    return [trace], [trace]


def add_raw_files(outcome: ProfileOutcome, raw: list[Path], limit_mb: float | None) -> None:
    """The raw profiler files as artifacts, except those over profile.artifact_max_mb (named in a tag)."""
    for path in raw:
        if limit_mb is None or path.stat().st_size <= limit_mb * 2**20:
            outcome.artifacts.append(path)
        else:
            outcome.tags.setdefault("ghsweep.profile_not_uploaded", "")
            outcome.tags["ghsweep.profile_not_uploaded"] += f"{path.name} ({path.stat().st_size / 2**20:.0f} MiB) "


def nsys_reports(run_dir: Path, world_size: int) -> list[Path]:
    """The run's nsys reports: profile.nsys-rep, or one per rank (profile_rank<N>.nsys-rep, in rank order)."""
    if world_size == 1:
        reports = [run_dir / NSYS_REPORT] if (run_dir / NSYS_REPORT).exists() else []
    else:
        reports = sorted(run_dir.glob(NSYS_RANK_GLOB), key=rank_of)
    if not reports:
        wanted = NSYS_REPORT if world_size == 1 else NSYS_RANK_GLOB
        raise ProfilerUnavailable(f"nsys wrote no report ({wanted}); see worker.log")
    return reports


def ncu_plan(top: list[dict]) -> tuple[int, bool, str]:
    """(--launch-count, per launch configuration?, in words) for the ncu pass over the top kernels:
    NCU_LAUNCHES_PER_CONFIG of each launch configuration the nsys profile saw (launch_configs),
    unless that exceeds NCU_MAX_LAUNCHES, then the first NCU_MAX_LAUNCHES launches of these kernels."""
    configs = sum(k.get("launch_configs") or 1 for k in top)
    if configs * NCU_LAUNCHES_PER_CONFIG <= NCU_MAX_LAUNCHES:
        return (
            NCU_LAUNCHES_PER_CONFIG,
            True,
            (
                f"{NCU_LAUNCHES_PER_CONFIG} launch per launch configuration "
                f"(~{configs * NCU_LAUNCHES_PER_CONFIG} launches)"
            ),
        )
    return NCU_MAX_LAUNCHES, False, f"the first {NCU_MAX_LAUNCHES} launches ({configs} launch configurations)"


def ncu_pass(config: ConfigSchema, run: RunPlan, profile_file: Path, run_ncu_pass: RunNcuPass) -> tuple[Path, dict]:
    """Second, short run of the worker under ncu over one captured step, for a few launches of each
    of the top-k kernels, as `run`'s plan says (its ncu_pass); (raw CSV, {seconds, kernels,
    launches}: what the pass did)."""
    plan, ncu = run.profile, run.profile.ncu_path
    if ncu is None or run.ncu_pass is None:
        raise ProfilerUnavailable("ncu pass skipped: the run's plan names no ncu path or ncu pass")
    options = carried(config.profile.ncu, "profile.ncu")
    top = analyze(profile_file).top_kernels[: options.top_k]
    if not top:
        raise ProfilerUnavailable("ncu pass skipped: the nsys profile has no kernels to pick from")
    names = sorted({k["short_name"] for k in top})
    launches, per_config, planned = ncu_plan(top)
    work = Path(run.ncu_pass.run_dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    # The worker's input is the composed config as the run's config.yaml holds it, shortened to one captured step.
    short = OmegaConf.load(Path(run.run_dir) / CONFIG)
    # The window's first step, in a run of its own length: past the first steps' compiling, never measured on.
    first = capture_steps(config.capture, config.train.max_steps).start
    short.capture.start_step, short.capture.num_steps = first, 1
    short.train.max_steps, short.train.measure = first + 2, False
    (work / CONFIG).write_text(OmegaConf.to_yaml(short))
    # The worker trains what its run directory's plan says: the run's own plan, moved to this folder.
    dataclasses.replace(run, run_dir=str(work)).save(work)
    report_path = work / NCU_REPORT
    metrics = options.metrics
    section_set = options.section_set
    started = time.monotonic()
    prefix = ncu_command(ncu, report_path, names, launches, section_set, metrics, per_config)
    if run_ncu_pass(run.ncu_pass.command(prefix), work) != 0 and metrics:
        # A metric this GPU or ncu version does not know: the section set alone still gives time
        # and FLOPs (bytes then read 0 and the roofline says so).
        log.warning("ncu with profile.ncu.metrics failed; retrying with --set %s only", section_set)
        prefix = ncu_command(ncu, report_path, names, launches, section_set, (), per_config)
        run_ncu_pass(run.ncu_pass.command(prefix), work)
    seconds = time.monotonic() - started
    if not report_path.exists():
        raise ProfilerUnavailable(
            f"the ncu pass failed (counters not readable, or no kernel matched {names}); see {work}/worker.log"
        )
    csv_path = ncu_raw_csv(ncu, report_path, Path(run.run_dir) / NCU_CSV, plan.tool_prefix)
    return csv_path, {"seconds": seconds, "kernels": names, "launches": planned}
