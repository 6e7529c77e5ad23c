"""`python -m ghsweep.analyze PATH [--json]`: where the time of a profiled run went.

PATH is an nsys SQLite export, an .nsys-rep (exported to SQLite first; needs nsys), a PyTorch
profiler trace (.json / .json.gz), or a run directory (its profile is found there). An Nsight
Compute CSV beside the profile (top_kernels_ncu.csv) adds the roofline of the top kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ghsweep.profile.capture import NCU_CSV, NSYS_REPORT, NSYS_SQLITE, TORCH_TRACE, ProfilerUnavailable
from ghsweep.profile import report
from ghsweep.profile.analysis import analyze
from ghsweep.profile.findings import evaluate, summary
from ghsweep.profile.roofline import kernel_points


def find_profile(run_dir: Path) -> Path | None:
    for name in (NSYS_SQLITE, NSYS_REPORT, TORCH_TRACE, TORCH_TRACE + ".gz"):
        if (run_dir / name).exists():
            return run_dir / name
    return None


def full_analysis(path: Path, context: dict | None = None, ncu_csv: Path | None = None,
                  nsys_path: str | None = None) -> dict:
    """Analysis + roofline (when an Nsight Compute CSV is given) + findings + summary lines."""
    result = analyze(path, nsys_path)
    if ncu_csv is not None:
        result["roofline"] = kernel_points(ncu_csv, sorted({k["short_name"] for k in result.get("top_kernels", [])}))
    result["findings"] = evaluate(result, context)
    result["summary"] = summary(result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ghsweep.analyze", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="nsys .sqlite / .nsys-rep, torch trace .json[.gz], or a run directory")
    parser.add_argument("--json", action="store_true", help="print the whole analysis as JSON")
    parser.add_argument("--ncu", type=Path, default=None, help="Nsight Compute raw CSV of the top kernels")
    args = parser.parse_args(argv)
    path = args.path
    if path.is_dir():
        found = find_profile(path)
        if found is None:
            print(f"ghsweep.analyze: {path}: no profile in this directory (looked for {NSYS_SQLITE}, {NSYS_REPORT}, "
                  f"{TORCH_TRACE})", file=sys.stderr)
            return 2
        path = found
    if not path.exists():
        print(f"ghsweep.analyze: {path}: no such file", file=sys.stderr)
        return 2
    try:
        ncu_csv = args.ncu or (path.parent / NCU_CSV if (path.parent / NCU_CSV).exists() else None)
        result = full_analysis(path, ncu_csv=ncu_csv)
    except (ProfilerUnavailable, ValueError) as exc:
        print(f"ghsweep.analyze: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(result, sys.stdout, indent=2, default=str)
        print()
    else:
        print(report.render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
