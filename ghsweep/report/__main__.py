"""Rebuild a sweep's comparison report, or write the profiling assignment's report, from MLflow alone.

python -m ghsweep.report SWEEP                      # SWEEP: the parent run's id or name
python -m ghsweep.report SWEEP --baseline 'precision=bf16 offload=off'
python -m ghsweep.report --assignment SWEEP         # its baseline vs its fastest other run
python -m ghsweep.report --assignment BASELINE_RUN OPTIMISED_RUN
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ghsweep.core.errors import SweepNotFound, TrackingError, TrackingUriError
from ghsweep.core.names import ROLE_RUN, ROLE_SWEEP
from ghsweep.report import assignment, compare
from ghsweep.report.sweep_source import find_run, load_run, load_sweep
from ghsweep.tracking import redact
from ghsweep.tracking.mlflow_store import MlflowStore, absolute_tracking_uri

DEFAULT_URI = "sqlite:///mlflow.db"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ghsweep.report",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="a sweep (parent run id or name, e.g. 'sweep 2026-11-21/01-49-38'); with --assignment "
        "also two runs (ids or names): baseline, then optimised",
    )
    parser.add_argument(
        "--assignment",
        action="store_true",
        help="the profiling assignment's report: Top-5 kernels, roofline, speedup, profile diff",
    )
    parser.add_argument(
        "--baseline",
        help="the sweep's baseline: a job number or the overrides of one combination "
        "(default: the sweep's report.baseline, else the first that finished)",
    )
    parser.add_argument("--out", type=Path, default=Path("ghsweep-report"), help="output folder (default: %(default)s)")
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_URI),
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else %(default)s)",
    )
    args = parser.parse_args(argv)
    if len(args.runs) > (2 if args.assignment else 1):
        parser.error(f"too many runs: {' '.join(args.runs)}; give one sweep, or --assignment with two runs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    uri = absolute_tracking_uri(args.tracking_uri, Path.cwd())
    out = args.out.absolute()
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():  # checked before MLflow is read: the report would be lost at its first file
        print(
            f"ghsweep.report: --out {args.out}: {existing} is a file, not a folder; give a folder "
            "(created when missing)",
            file=sys.stderr,
        )
        return 2
    store_file = uri.removeprefix("sqlite:///")
    if uri.startswith("sqlite:///") and not Path(store_file).exists():
        # MLflow would create an empty store there and then find no sweep in it.
        print(
            f"ghsweep.report: no MLflow store at {store_file}; run this where the sweep ran, or give "
            "--tracking-uri (or $MLFLOW_TRACKING_URI)",
            file=sys.stderr,
        )
        return 2
    try:
        store = MlflowStore(uri, experiment=None)
        if args.assignment and len(args.runs) == 2:
            baseline, optimised = (load_run(store, find_run(store, ref, ROLE_RUN)) for ref in args.runs)
            files = assignment.write_assignment(baseline, optimised, args.out)
            print(assignment.summary(baseline, optimised))
        elif args.assignment:
            parent = find_run(store, args.runs[0], ROLE_SWEEP)
            c = compare.build(parent.name, load_sweep(store, parent), args.baseline)
            base = c.baseline
            others = [i for i, r in enumerate(c.runs) if r.finished and i != base]
            if base is None or not others:  # no baseline: no speedups either
                raise SweepNotFound(
                    f"sweep {args.runs[0]!r}: needs two finished runs for --assignment, has "
                    f"{sum(r.finished for r in c.runs)}"
                )
            # The fastest by its speedup; where none was compared (a busy machine), by its tokens/s, said so.
            compared = [i for i in others if c.speedups[i] is not None]
            if compared:
                optimised = c.runs[max(compared, key=lambda i: c.speedups[i] or 0.0)]
            else:
                optimised = c.runs[max(others, key=lambda i: c.runs[i].metrics.get("tokens_per_s", 0.0))]
                print(
                    "ghsweep.report: the runs were measured on a busy machine (MLflow tag ghsweep.contended): "
                    "the assignment's speedup is the machine's load as much as the code's",
                    file=sys.stderr,
                )
            files = assignment.write_assignment(c.runs[base], optimised, args.out)
            print(assignment.summary(c.runs[base], optimised))
        else:
            parent = find_run(store, args.runs[0], ROLE_SWEEP)
            c, files = compare.compare_sweep(store, parent, args.out, args.baseline)
            print("\n".join(compare.verdict(c)))
    except (SweepNotFound, compare.BaselineError, TrackingUriError) as exc:
        print(f"ghsweep.report: {exc}", file=sys.stderr)
        return 2
    except TrackingError as exc:
        print(f"ghsweep.report: {exc} (tracking URI {redact.text(uri)})", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(f) for f in files[:2]) + (f" and {len(files) - 2} plots" if len(files) > 2 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
