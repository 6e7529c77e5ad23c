"""A run's whole profile analysis: the numbers (analysis.py), the roofline of the top kernels when
Nsight Compute measured them, the findings and summary lines; for a run on several GPUs, every
rank's, combined (ranks.py)."""

from __future__ import annotations

from pathlib import Path

from ghsweep.profile.analysis import analyze
from ghsweep.profile.findings import evaluate, summary
from ghsweep.profile.ranks import combine, rank_of
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.profile.roofline import kernel_points


def full_analysis(
    path: Path, context: dict | None = None, ncu_csv: Path | None = None, nsys_path: str | None = None
) -> ProfileAnalysis:
    """Analysis + roofline (when an Nsight Compute CSV is given) + findings + summary lines."""
    result = analyze(path, nsys_path)
    if ncu_csv is not None:
        result.roofline = kernel_points(ncu_csv, sorted({k["short_name"] for k in result.top_kernels}))
    result.findings = evaluate(result, context)
    result.summary = summary(result)
    return result


def rank_analysis(
    paths: list[Path], context: dict | None, world_size: int, nsys_path: str | None = None
) -> ProfileAnalysis:
    """One run on several GPUs: each rank's report (profile_rank<N>.*) analysed, combined (profile/ranks.py)."""
    per_rank = {rank_of(p): (p, full_analysis(p, context, nsys_path=nsys_path)) for p in paths}
    return combine(per_rank, world_size)
