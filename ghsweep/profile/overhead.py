"""The profiler's own cost in a run: how much slower its traced steps ran than its measured ones,
and whether the sweep's work on earlier runs ran beside its steps.

Tracing every launch costs the host time per launch (CUPTI's callbacks, and OS-runtime tracing of
every wait when osrt is traced); a run that launches many small kernels (fp8's casts and amax)
pays it on each one, and the GPU waits: the profiled steps show launch gaps the untraced steps do
not have. The worker measures its steps untraced (summary.json's step_time_ms, the traced capture
window left out), so profiled step - measured step is the profiler's share of every idle figure.

A local sweep runs the follow-up of each run (its profile's export and analysis, report, MLflow
record) on one thread while the next run starts; that run waits, before its first measured step,
until the sweep makes its `measure_after` file (launch/followups.py). The file's time against the
run's first steady step says whether that held.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from ghsweep.core.run_dir import CONFIG, METRICS, RUN_PLAN, SUMMARY
from ghsweep.profile.result import ProfileAnalysis


@dataclass(frozen=True)
class MeasuredRun:
    """What a run directory says of the run beside its profile."""

    step_ms: float | None = None  # the measured (untraced) steady step, summary.json's step_time_ms
    # Why the sweep's follow-up work on earlier runs overlapped this run's steps; None: not found to.
    overlap: str | None = None
    captured_blocks: str | None = None  # summary.json's info: the captured steps' blocks (dolly_data.CapturedBlocks)

    @classmethod
    def of(cls, run_dir: Path) -> MeasuredRun:
        """From summary.json (and run_plan.json / measure_after for the overlap); empty where absent."""
        try:
            summary = json.loads((run_dir / SUMMARY).read_text())
        except (OSError, ValueError):
            return cls()
        step = summary.get("metrics", {}).get("step_time_ms")
        step = float(step) if isinstance(step, (int, float)) and step == step and step > 0 else None
        blocks = summary.get("info", {}).get("captured_blocks")
        return cls(
            step, followups_overlap(run_dir, summary.get("timing", {})), blocks if isinstance(blocks, str) else None
        )


def followups_overlap(run_dir: Path, timing: dict) -> str | None:
    """Why the sweep's work on earlier runs ran beside this run's measured or profiled steps, or None.

    The worker waits for the plan's measure_after file before step train.warmup_steps, the first it
    may measure; a capture window set to start earlier (capture.start_step) runs before that wait.
    Every step from the first measured or profiled one on (metrics.jsonl) ran before the last flush
    (timing's steady_to), so they began at steady_to - their summed time or earlier. A file made after
    that moment was made while they ran (the sweep's work goes on until it makes the file): a
    sufficient test, never a false alarm (the steps' host gaps only move them earlier)."""
    try:
        waited_for = json.loads((run_dir / RUN_PLAN).read_text()).get("measure_after")
        config = OmegaConf.load(run_dir / CONFIG)
        first = int(config.train.warmup_steps)
        capture_start = OmegaConf.select(config, "capture.start_step")
        if isinstance(capture_start, int):
            first = min(first, capture_start)
        rows = [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines() if line.strip()]
    except (OSError, ValueError, AttributeError):
        return None
    last_flush = timing.get("steady_to")
    if not waited_for or last_flush is None:
        return None
    go = Path(waited_for)
    if not go.exists():
        return (
            f"the sweep's work on earlier runs (their export, analysis and record) was not done when this run "
            f"measured: {go.name} was never made, and the run measured anyway"
        )
    began_by = float(last_flush) - sum(r.get("step_time_ms", 0.0) for r in rows if r.get("step", -1) >= first) / 1e3
    late_s = go.stat().st_mtime - began_by
    if late_s > 0:
        return (
            f"the sweep's work on earlier runs (their export, analysis and record) ran beside this run's "
            f"measured or profiled steps for {late_s:.1f} s or more ({go.name} made after they began)"
        )
    return None


def profiled_step_ms(a: ProfileAnalysis) -> float | None:
    """The mean profiled steady step (time_per_step; the mean over ranks on several GPUs)."""
    steps = [row.get("time_per_step", {}).get("step_ms") for row in a.ranks] or [a.time_per_step.get("step_ms")]
    known = [s for s in steps if s]
    return statistics.fmean(known) if known and len(known) == len(steps) else None


def apply(a: ProfileAnalysis, measured_step_ms: float | None) -> None:
    """Set the analysis' profiled_step_ms, measured_step_ms and profiler_overhead_pct."""
    a.profiled_step_ms = profiled_step_ms(a)
    a.measured_step_ms = measured_step_ms
    a.profiler_overhead_pct = (
        100.0 * (a.profiled_step_ms - measured_step_ms) / measured_step_ms
        if a.profiled_step_ms is not None and measured_step_ms
        else None
    )


def overhead_ms(a: ProfileAnalysis) -> float:
    """Profiled minus measured step (ms, 0 when unknown or negative: a traced step no slower)."""
    if a.profiled_step_ms is None or a.measured_step_ms is None:
        return 0.0
    return max(0.0, a.profiled_step_ms - a.measured_step_ms)
