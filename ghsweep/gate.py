"""Regression gate: compare a sweep's runs with a committed reference, one line per regression.

    python -m ghsweep.gate SWEEP --against benchmarks/REFERENCE.json [--tolerance 5%]
    python -m ghsweep.gate SWEEP --against benchmarks/REFERENCE.json --write [--checks loss,overhead_ratio]

SWEEP is a sweep directory (multirun/<date>/<time>, or the hydra.sweep.dir a CI job set) or a
sweep's MLflow name or parent run id. Each combination of the reference must be in the sweep and
FINISHED; throughput metrics must not drop, memory and time metrics not rise, by more than the
tolerance; each step's loss must stay within the loss band of the reference's. Where the reference
stores a metric's 95% interval (noise_pct) or the run recorded its own, a change is a regression
only when it is beyond the tolerance and outside the noise of both (what is known of it); noise
wider than the tolerance is reported INCONCLUSIVE (exit status 3), neither pass nor fail. `overhead_ratio` is a
run's time outside its training loop (overhead_s) over its worker's start (startup_s: a fresh Python
importing torch), a reference measured in the same run on the same machine: ghsweep's own per-run
cost, comparable on CI machines whose absolute timings mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import NoReturn

from ghsweep.core import stats
from ghsweep.core.atomic import write_atomic
from ghsweep.core.errors import GateError, SweepNotFound, TrackingError, TrackingUriError
from ghsweep.core.names import CODE_TAG, ROLE_SWEEP
from ghsweep.launch.resume import identity_overrides
from ghsweep.launch.sweep_manifest import SweepManifest
from ghsweep.report.sweep_source import SweepRun, find_run, load_sweep
from ghsweep.tracking.mlflow_store import MlflowStore, absolute_tracking_uri

HIGHER_IS_BETTER = ("tokens_per_s", "mfu", "tflops_per_gpu")
LOWER_IS_BETTER = ("peak_mem_gb", "step_time_ms", "overhead_ratio")
LOSS = "loss"
OVERHEAD = "overhead_ratio"
CHECKS = (*HIGHER_IS_BETTER, *LOWER_IS_BETTER, LOSS)
DEFAULT_CHECKS = "tokens_per_s,mfu,peak_mem_gb,loss"
# The ratio varied by +-7% between runs on a loaded 2-core machine; a slower MLflow record or job still fails.
OWN_TOLERANCES = {"overhead_ratio": 0.2}


def fraction(text: str) -> float:
    """'5%' or '0.05' -> 0.05."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a fraction such as 5% or 0.05") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 0% and below 100%")
    return value


def combination(run: SweepRun) -> str:
    """The run's overrides that decide what it trains (not where it is recorded or launched), sorted."""
    return " ".join(sorted(identity_overrides(run.overrides)))


def forked(run: SweepRun) -> bool:
    """Whether the run's worker may have been forked from the pre-imported one, whose start (0.1 s) is no
    fresh interpreter's: overhead_ratio is not measured there."""
    return run.params.get("worker.preimported") == "True"


def measured(run: SweepRun, checks: list[str]) -> dict:
    """The run's values of the checked metrics it recorded (the loss as [step, value] pairs)."""
    values: dict = {m: run.metrics[m] for m in checks if m in run.metrics}
    if OVERHEAD in checks and "overhead_s" in run.metrics and run.metrics.get("startup_s") and not forked(run):
        values[OVERHEAD] = run.metrics["overhead_s"] / run.metrics["startup_s"]
    if LOSS in checks and run.loss:
        values[LOSS] = [[step, value] for step, value in run.loss]
    return values


def load_runs(sweep: str, tracking_uri: str) -> tuple[str, list[SweepRun]]:
    """The sweep's command (or name) and its runs, from MLflow."""
    manifest = SweepManifest.load(Path(sweep)) if Path(sweep).is_dir() else None
    store = MlflowStore(
        manifest.tracking_uri if manifest else absolute_tracking_uri(tracking_uri, Path.cwd()), experiment=None
    )
    parent = store.get_run(manifest.parent_run_id) if manifest else find_run(store, sweep, ROLE_SWEEP)
    return (manifest.command if manifest else parent.name), load_sweep(store, parent)


def code_of(runs: list[SweepRun]) -> str:
    """The code the runs ran (their ghsweep.code tags), `unknown` for runs recorded before it was tagged."""
    return ", ".join(sorted({r.tags.get(CODE_TAG, "unknown") for r in runs})) or "unknown"


def check_writable(path: Path) -> None:
    """GateError (one line) for a reference that cannot be written there, before any sweep is read."""
    if path.is_dir():
        raise GateError(f"--write --against {path}: a directory; name the reference file to write")
    blocking = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise GateError(f"--write --against {path}: {blocking} is a file, not a folder")


def write_reference(command: str, runs: list[SweepRun], checks: list[str], path: Path) -> dict:
    failed = [r for r in runs if not r.finished]
    if failed:
        raise GateError(
            f"{combination(failed[0])}: {failed[0].status} ({failed[0].error}); a reference needs every run FINISHED"
        )
    unmeasured = next((r for r in runs if not measured(r, checks)), None)
    if unmeasured is not None:
        raise GateError(
            f"{combination(unmeasured)}: recorded none of the checks ({', '.join(checks)}); a reference needs a "
            "value to compare: choose --checks it records"
        )
    reference = {
        "command": command,
        "device": runs[0].tags.get("ghsweep.device_name", "unknown") if runs else "unknown",
        "code": code_of(runs),
        "checks": checks,
        "tolerances": {k: v for k, v in OWN_TOLERANCES.items() if k in checks},
        "runs": {combination(r): measured(r, checks) for r in runs},
        # Half-width of each metric's 95% interval, % of its value (a relative width survives rescaling).
        "noise_pct": {combination(r): noise_pct(r, checks) for r in runs},
    }
    try:
        # The reference's folder is made, as a CI recipe's first --write into its repository needs.
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(reference, indent=1) + "\n", mode=0o644)
    except OSError as error:
        raise GateError(f"--write --against {path}: {error.strerror or error}") from None
    return reference


def _loss_regression(ref: list, got: list, band: float) -> str | None:
    got_by_step = dict((int(s), v) for s, v in got)
    for step, expected in ref:
        if int(step) not in got_by_step:
            return f"loss at step {int(step)} not recorded"
        value = got_by_step[int(step)]
        if abs(value - expected) > band * abs(expected):
            return f"loss at step {int(step)} {value:.4g}, outside {expected:.4g} +- {band:.0%}"
    return None


def noise_pct(run: SweepRun, checks: list[str]) -> dict[str, float]:
    """The half-widths (%) of the checked metrics' intervals the run recorded."""
    found = {m: stats.from_metrics(run.metrics, m) for m in checks if m in (*HIGHER_IS_BETTER, *LOWER_IS_BETTER)}
    return {m: i.half_width_pct for m, i in found.items() if i is not None and i.known}


def noisy(value: float, half_width_pct: float | None) -> stats.Interval:
    """A value with its interval; None: no noise known (the value alone)."""
    pct = half_width_pct or 0.0
    return stats.Interval(value, value * (1 - pct / 100), value * (1 + pct / 100))


def judge(got: stats.Interval, ref: stats.Interval, allowed: float, higher_is_better: bool) -> str | None:
    """'regression', 'inconclusive' or None (pass) for a measurement against its reference."""
    change = stats.ratio(got, ref) if higher_is_better else stats.ratio(ref, got)  # > 1: better
    if change.low >= 1 - allowed:  # even the worst case is within the tolerance
        return None
    if change.high < 1 - allowed:  # even the best case is beyond the tolerance
        return "regression"
    if change.half_width_pct / 100 > allowed:  # noise wider than the tolerance: cannot tell
        return "inconclusive"
    return "regression" if change.estimate < 1 - allowed and change.high < 1 else None


def regressions(
    reference: dict, runs: list[SweepRun], tolerance: float, loss_band: float
) -> tuple[list[str], list[str], list[str]]:
    """(one line per regression, one per inconclusive check, one per check left out); ([], [], []) when the
    sweep passes every check."""
    found, unsure, left_out = [], [], []
    by_combination = {combination(r): r for r in runs}
    tolerances = reference.get("tolerances", {})
    for name, expected in reference["runs"].items():
        run = by_combination.get(name)
        if run is None:
            found.append(f"{name}: not in the sweep (every combination of the reference must be run)")
            continue
        if not run.finished:
            found.append(f"{name}: {run.status}: {run.error}")
            continue
        got = measured(run, reference["checks"])
        ref_noise = reference.get("noise_pct", {}).get(name, {})
        for metric, ref_value in expected.items():
            if metric == OVERHEAD and forked(run):
                left_out.append(
                    f"{name}: {OVERHEAD} not judged: its worker was forked from the pre-imported one, not started "
                    "as a fresh interpreter (worker.preimported=false measures it)"
                )
            elif metric not in got:
                found.append(f"{name}: {metric} not recorded")
            elif metric == LOSS:
                problem = _loss_regression(ref_value, got[LOSS], loss_band)
                if problem:
                    found.append(f"{name}: {problem}")
            elif ref_value and got[metric]:  # a zero (an unmeasured rate) has no ratio to judge
                allowed = tolerances.get(metric, tolerance)
                ref_i, mine = noisy(ref_value, ref_noise.get(metric)), stats.from_metrics(run.metrics, metric)
                if mine is None or not mine.known:
                    mine = noisy(got[metric], None)
                verdict = judge(mine, ref_i, allowed, metric in HIGHER_IS_BETTER)
                change = got[metric] / ref_value - 1
                width = stats.ratio(mine, ref_i).half_width_pct
                noise = f", noise ±{width:.1f}%" if width > 0 else ""
                line = (
                    f"{name}: {metric} {got[metric]:.4g} against {ref_value:.4g} "
                    f"({change:+.1%}, tolerance {allowed:.0%}{noise})"
                )
                if verdict == "regression":
                    found.append(line)
                elif verdict == "inconclusive":
                    unsure.append(line)
    return found, unsure, left_out


def load_reference(path: Path) -> dict:
    """The reference file, checked before any sweep is read: GateError (exit 2, one line) for one that
    cannot gate, a reference with no runs or no checks included (it would pass while checking nothing)."""
    expected = "expected a reference written by --write (an object with checks and runs)"
    if not path.is_file():
        what = "a directory, not a file" if path.is_dir() else "no such file"
        raise GateError(f"--against {path}: {what}; record one with --write")
    try:
        reference = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise GateError(f"--against {path}: not JSON text ({str(error).splitlines()[0]}); {expected}") from None
    if not isinstance(reference, dict):
        raise GateError(f"--against {path}: a JSON {type(reference).__name__}, not an object; {expected}")
    checks, runs, tolerances = reference.get("checks"), reference.get("runs"), reference.get("tolerances", {})
    noise = reference.get("noise_pct", {})
    if not isinstance(checks, list) or not checks or not all(c in CHECKS for c in checks):
        raise GateError(f"--against {path}: checks={_shown(checks)}; accepted: a non-empty list of {', '.join(CHECKS)}")
    if not isinstance(runs, dict) or not runs:
        raise GateError(f"--against {path}: runs={_shown(runs)}: no combination to gate; {expected}")
    if not isinstance(tolerances, dict) or not all(_is_number(v) and 0 <= v < 1 for v in tolerances.values()):
        raise GateError(
            f"--against {path}: tolerances={_shown(tolerances)}: expected a fraction (at least 0, below 1) by metric"
        )
    for name, values in runs.items():
        if not isinstance(values, dict) or not values or not all(_is_reference_value(m, v) for m, v in values.items()):
            raise GateError(
                f"--against {path}: runs[{name!r}]={_shown(values)}: expected a finite number for each checked "
                "metric and [[step, loss], ...] for loss"
            )
    if not isinstance(noise, dict) or not all(
        isinstance(pcts, dict) and all(_is_number(v) and v >= 0 for v in pcts.values()) for pcts in noise.values()
    ):
        raise GateError(
            f"--against {path}: noise_pct={_shown(noise)}: expected the half-width (%, a finite number >= 0) of "
            "each metric by combination"
        )
    return reference


def _shown(value: object) -> str:
    """A reference's value as JSON, cut to one short line."""
    return json.dumps(value)[:80]


def _is_number(value: object) -> bool:
    """A finite JSON number: json.loads reads NaN and Infinity, which compare false with everything."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_reference_value(metric: str, value: object) -> bool:
    if metric == LOSS:
        return isinstance(value, list) and all(
            isinstance(p, list) and len(p) == 2 and all(_is_number(x) for x in p) for p in value
        )
    return metric in CHECKS and _is_number(value)


class OneLineParser(argparse.ArgumentParser):
    """A bad argument in one line, exit status 2, as every refusal of the gate (argparse adds its usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"ghsweep.gate: {message} (--help lists the arguments)\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    doc = __doc__.splitlines()
    parser = OneLineParser(
        prog="python -m ghsweep.gate",
        description=doc[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(doc[2:]),
    )
    parser.add_argument("sweep", metavar="SWEEP", help="a sweep directory, or a sweep's MLflow name or parent run id")
    parser.add_argument("--against", type=Path, required=True, metavar="REFERENCE.json", help="the reference file")
    parser.add_argument(
        "--tolerance",
        type=fraction,
        default=0.05,
        help="largest drop of throughput / rise of memory and time allowed (default: 5%%)",
    )
    parser.add_argument(
        "--loss-band",
        type=fraction,
        default=0.05,
        help="largest deviation of each step's loss from the reference's (default: 5%%)",
    )
    parser.add_argument("--write", action="store_true", help="record the sweep as the new reference")
    parser.add_argument(
        "--checks",
        default=DEFAULT_CHECKS,
        help=f"with --write: what the reference gates, of {', '.join(CHECKS)} (default: %(default)s)",
    )
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"),
        help="MLflow tracking URI for a sweep given by name (default: $MLFLOW_TRACKING_URI, else "
        "%(default)s); a sweep directory names its own",
    )
    args = parser.parse_args(argv)
    args.checks_given = args.checks
    args.checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        parser.error(f"--checks {unknown[0]}: unknown; accepted: {', '.join(CHECKS)}")
    if not args.checks:
        parser.error(
            f"--checks {args.checks_given!r}: no check named; accepted: a comma-separated list of {', '.join(CHECKS)}"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.write:
            check_writable(args.against)
        reference = {} if args.write else load_reference(args.against)
        command, runs = load_runs(args.sweep, args.tracking_uri)
        if args.write:
            reference = write_reference(command, runs, args.checks, args.against)
            print(
                f"ghsweep.gate: wrote {args.against}: {len(reference['runs'])} combinations, "
                f"checks {', '.join(args.checks)}"
            )
            return 0
        found, unsure, left_out = regressions(reference, runs, args.tolerance, args.loss_band)
    except (GateError, SweepNotFound, TrackingUriError) as exc:
        print(f"ghsweep.gate: {exc}", file=sys.stderr)
        return 2
    except TrackingError as exc:
        print(f"ghsweep.gate: {exc}", file=sys.stderr)
        return 2
    # Which reference was read, and the code each side ran: a changed code with moved numbers is what fails.
    print(
        f"ghsweep.gate: reference {args.against.resolve()}: recorded with {reference.get('code', 'unknown')}; "
        f"this sweep ran {code_of(runs)}"
    )
    for line in found:
        print(f"REGRESSION {line}")
    for line in unsure:
        print(f"INCONCLUSIVE {line}: the noise is wider than the tolerance; measure longer (train.measure) or repeat")
    for line in left_out:
        print(f"note: {line}")
    extra = sorted({combination(r) for r in runs} - set(reference["runs"]))
    for name in extra:
        print(f"note: {name}: in the sweep, not in the reference (not gated)")
    verdict = "FAILED" if found else "inconclusive" if unsure else "passed"
    print(
        f"ghsweep.gate: {verdict}: {len(found)} regressions, {len(unsure)} inconclusive in {len(reference['runs'])} "
        f"combinations against {args.against} (checks {', '.join(reference['checks'])}; tolerance "
        f"{args.tolerance:.0%}, loss band {args.loss_band:.0%})"
    )
    return 1 if found else 3 if unsure else 0


if __name__ == "__main__":
    sys.exit(main())
