"""A run's whole profile analysis: the numbers (analysis.py), the roofline of the top kernels when
Nsight Compute measured them, the findings and summary lines; for a run on several GPUs, every
rank's, combined (ranks.py)."""

from __future__ import annotations

from pathlib import Path

from ghsweep.profile import overhead
from ghsweep.profile.analysis import analyze
from ghsweep.profile.findings import evaluate, profiler_overhead, summary
from ghsweep.profile.overhead import MeasuredRun
from ghsweep.profile.ranks import combine, rank_of
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.profile.roofline import kernel_points


def full_analysis(
    path: Path,
    context: dict | None = None,
    ncu_csv: Path | None = None,
    nsys_path: str | None = None,
    measured: MeasuredRun | None = None,
) -> ProfileAnalysis:
    """Analysis + roofline (when an Nsight Compute CSV is given) + the profiler's overhead (against
    `measured`, what the run directory says) + findings + summary lines."""
    result = analyze(path, nsys_path)
    if ncu_csv is not None:
        result.roofline = kernel_points(ncu_csv, sorted({k["short_name"] for k in result.top_kernels}))
    measured = measured or MeasuredRun()
    overhead.apply(result, measured.step_ms)
    result.captured_blocks = measured.captured_blocks
    result.findings = evaluate(result, context, measured.overlap)
    result.summary = summary(result)
    return result


def rank_analysis(
    paths: list[Path],
    context: dict | None,
    world_size: int,
    nsys_path: str | None = None,
    measured: MeasuredRun | None = None,
) -> ProfileAnalysis:
    """One run on several GPUs: each rank's report (profile_rank<N>.*) analysed (each rank's idle
    findings net of its own profiler overhead), combined (profile/ranks.py); the run's overhead is
    its ranks' mean profiled step against the measured one."""
    measured = measured or MeasuredRun()
    per_rank = {rank_of(p): (p, full_analysis(p, context, nsys_path=nsys_path, measured=measured)) for p in paths}
    result = combine(per_rank, world_size)
    overhead.apply(result, measured.step_ms)
    result.captured_blocks = measured.captured_blocks
    rank_zero = [f for f in result.findings if f.id != "profiler_overhead"]
    result.findings = profiler_overhead(result) + rank_zero
    return result
