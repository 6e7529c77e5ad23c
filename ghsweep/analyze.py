"""`python -m ghsweep.analyze PATH [--against BASELINE] [--json]`: where the time of a profiled run went.

PATH is an nsys SQLite export, an .nsys-rep (exported to SQLite first; needs nsys), a PyTorch
profiler trace (.json / .json.gz), a run directory (its profile is found there; a run on several
GPUs: every rank's profile_rank<N> report, analysed together) or a PyTorch profiler output
directory (`*.pt.trace.json[.gz]`). An Nsight Compute CSV beside the profile
(top_kernels_ncu.csv) adds the roofline of the top kernels. A profile that cannot be analysed is
one line on stderr naming the file and what is wrong, and exit status 2.

A run directory's summary.json gives the run's measured (untraced) step time: the analysis then
says how much the profiler slowed the steps it traced (profiler_overhead_pct) and states its idle
findings net of that. `--against BASELINE` (any PATH as above) adds `step_delta`: where the step
time went between the two runs (profile/delta.py), in ms per step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ghsweep.core.errors import ProfileError, ProfilerUnavailable, first_line, one_line
from ghsweep.core.run_dir import NCU_CSV, NSYS_RANK_GLOB, NSYS_REPORT, NSYS_SQLITE, TORCH_TRACE
from ghsweep.profile import delta, profile_report
from ghsweep.profile.overhead import MeasuredRun
from ghsweep.profile.ranks import rank_of
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.profile.run_analysis import full_analysis, rank_analysis

TORCH_PROFILER_TRACES = ("*.pt.trace.json", "*.pt.trace.json.gz")


def find_profile(directory: Path) -> Path:
    """The profile in a run directory, or the newest trace of a PyTorch profiler output directory
    (one per profiling cycle and rank; the others are named on stderr); ProfileError if none."""
    for name in (NSYS_SQLITE, NSYS_REPORT, TORCH_TRACE, TORCH_TRACE + ".gz"):
        if (directory / name).is_file():
            return directory / name
    traces = sorted(
        (p for pattern in TORCH_PROFILER_TRACES for p in directory.glob(pattern)),
        key=lambda p: (p.stat().st_mtime, p.name),
    )
    if not traces:
        raise ProfileError(
            f"{directory}: no profile in this directory (looked for {NSYS_SQLITE}, {NSYS_REPORT}, "
            f"{TORCH_TRACE}[.gz], {', '.join(TORCH_PROFILER_TRACES)})"
        )
    if len(traces) > 1:
        print(
            f"ghsweep.analyze: {directory}: {len(traces)} PyTorch profiler traces; analysing the newest, "
            f"{traces[-1].name} (pass another one to analyse it)",
            file=sys.stderr,
        )
    return traces[-1]


def rank_profiles(directory: Path) -> list[Path]:
    """A run directory's per-rank nsys profiles, one per rank (the export where there is one), in rank order."""
    found: dict[int, Path] = {}
    for pattern in (NSYS_RANK_GLOB, NSYS_RANK_GLOB.replace(".nsys-rep", ".sqlite")):
        found |= {rank_of(p): p for p in directory.glob(pattern)}
    return [found[r] for r in sorted(found)]


def analyse_path(path: Path, ncu: Path | None = None) -> ProfileAnalysis:
    """The analysis of PATH (see the module's docstring); a run directory's measured steps too."""
    measured = MeasuredRun.of(path) if path.is_dir() else None
    ranks = rank_profiles(path) if path.is_dir() else []
    if len(ranks) > 1:
        # The world is what the reports show: the run's config may be elsewhere.
        return rank_analysis(ranks, None, max(rank_of(p) for p in ranks) + 1, measured=measured)
    profile = find_profile(path) if path.is_dir() else path
    if ncu is not None and not ncu.is_file():
        raise ProfileError(f"{ncu}: no such Nsight Compute CSV")
    ncu_csv = ncu or (profile.parent / NCU_CSV if (profile.parent / NCU_CSV).is_file() else None)
    return full_analysis(profile, ncu_csv=ncu_csv, measured=measured)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ghsweep.analyze", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="nsys .sqlite / .nsys-rep, torch trace .json[.gz], or a run directory")
    parser.add_argument("--json", action="store_true", help="print the whole analysis as JSON")
    parser.add_argument("--ncu", type=Path, default=None, help="Nsight Compute raw CSV of the top kernels")
    parser.add_argument(
        "--against", type=Path, default=None, help="a baseline run (any PATH): where the step time went between the two"
    )
    args = parser.parse_args(argv)
    where = args.path
    try:
        result = analyse_path(args.path, args.ncu)
        step_delta = None
        if args.against is not None:
            where = args.against
            step_delta = delta.step_delta(analyse_path(args.against), result)
    except (ProfilerUnavailable, ValueError, OSError) as exc:
        print(f"ghsweep.analyze: {first_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a tool ends in one line, never a traceback
        print(f"ghsweep.analyze: {where}: could not be analysed ({one_line(exc)})", file=sys.stderr)
        return 2
    if args.json:
        json.dump(
            result.to_dict() | ({"step_delta": step_delta} if step_delta else {}), sys.stdout, indent=2, default=str
        )
        print()
    else:
        print(profile_report.render(result) + (f"\n{delta.render(step_delta)}" if step_delta else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
