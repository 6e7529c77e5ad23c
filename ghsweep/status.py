"""Follow and collect a sweep submitted with `wait=false`.

    python -m ghsweep.status SWEEP_DIR           # each job's SLURM state; collects once all ended
    python -m ghsweep.status SWEEP_DIR --wait    # block until every job ended, then collect

Collecting is what a waiting sweep does at its end: jobs that ended without recording themselves
(cancelled, killed at the time limit) are recorded FAILED/KILLED in MLflow with their SLURM log, the
summary table is printed and the sweep's MLflow run is ended. The exit status is non-zero when a
run failed, as for a waiting sweep; a sweep that ended is answered from its directory (SweepEnd), in
a fraction of a second, with the same exit status.

A local sweep whose process died (`kill -9`) is collected the same way: its runs left RUNNING end
FAILED with "the sweep process died".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ghsweep.core.errors import SweepNotFound
from ghsweep.core.run_dir import SLURM_JOBS, SWEEP_MANIFEST
from ghsweep.launch.sweep_manifest import NOBODY, SweepEnd, SweepManifest, live_holder

# MLflow, submitit and the sweep's end are imported where a sweep needs them (collecting it, or one
# that ended before it recorded its end in its directory): an ended sweep is answered in well under
# a second, their imports take seconds.


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ghsweep.status", description=__doc__.splitlines()[0])
    parser.add_argument(
        "sweep_dir",
        type=Path,
        nargs="?",
        help="the sweep directory (printed when it was submitted); without it, the newest sweeps under ./multirun",
    )
    parser.add_argument("--wait", action="store_true", help="wait until every job ended, then collect")
    parser.add_argument("--poll-s", type=float, default=10.0, help="seconds between looks with --wait")
    args = parser.parse_args(argv)
    if args.sweep_dir is None:
        return list_sweeps(Path("multirun"))
    try:
        return status(parser, args)
    except SweepNotFound as exc:
        print(f"ghsweep.status: {exc}", file=sys.stderr)
        return 1


def status(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    ended, holder = SweepEnd.load(args.sweep_dir), live_holder(args.sweep_dir)
    if ended is not None and holder in (NOBODY, None):
        return print_end(args.sweep_dir, ended)
    if not (args.sweep_dir / SLURM_JOBS).exists():
        manifest = SweepManifest.load(args.sweep_dir)
        if manifest is None:
            parser.error(
                f"{args.sweep_dir}: not a sweep directory (no {SWEEP_MANIFEST} or {SLURM_JOBS}); accepted: "
                "the directory a sweep printed, e.g. multirun/2026-11-21/10-00-00"
            )
        if holder not in (NOBODY, None):  # its process holds the directory's lock while it lives
            print(f"ghsweep: the sweep is still running ({holder}); run this again later")
            return 0
        return collect_local(args.sweep_dir, manifest)
    from ghsweep.launch.callbacks import finish_sweep
    from ghsweep.launch.slurm.submitted_jobs import collect_results, has_ended, load_jobs

    jobs = [(s, s.submitit_job()) for s in load_jobs(args.sweep_dir)]
    while True:
        states = {s.job_id: j.state for s, j in jobs}
        for s, _ in jobs:
            print(f"#{s.num:<3} job {s.job_id:<12} {states[s.job_id]:<22} {s.name}")
        running = [s for s, j in jobs if not has_ended(j)]
        if not running:
            break
        if not args.wait:
            print(f"ghsweep: {len(running)} of {len(jobs)} jobs have not ended; run this again later, or with --wait")
            return 0
        time.sleep(args.poll_s)
        print()

    collect_results(args.sweep_dir, jobs)
    finish_sweep(args.sweep_dir)
    return 0


def list_sweeps(root: Path, limit: int = 10) -> int:
    """The newest sweep directories under `root` (multirun/DATE/TIME), newest first."""
    found = sorted(
        (p.parent for p in root.glob(f"*/*/{SWEEP_MANIFEST}")), key=lambda d: d.stat().st_mtime, reverse=True
    )
    if not found:
        print(
            f"ghsweep.status: no sweep under {root.resolve()}; give its directory: python -m ghsweep.status SWEEP_DIR"
        )
        return 2
    print(f"ghsweep.status: the newest sweeps under {root}; follow one with python -m ghsweep.status SWEEP_DIR")
    for sweep_dir in found[:limit]:
        try:
            # Counted from the file: SubmittedJob's module imports submitit and MLflow.
            jobs = json.loads((sweep_dir / SLURM_JOBS).read_text()) if (sweep_dir / SLURM_JOBS).exists() else []
            command = SweepManifest.require(sweep_dir).command
        except (SweepNotFound, OSError, ValueError, TypeError) as exc:  # one sweep that cannot be read hides no other
            print(f"  {sweep_dir}  (skipped: {exc})")
            continue
        kind = f"{len(jobs)} SLURM jobs" if jobs else "local"
        print(f"  {sweep_dir}  ({kind}: {command})")
    return 0


def collect_local(sweep_dir: Path, manifest: SweepManifest) -> int:
    """A sweep whose jobs ran in its own process: ended already, still running, or its process died."""
    from ghsweep.core.run_result import RunStatus
    from ghsweep.launch.callbacks import finish_sweep
    from ghsweep.launch.stale_runs import PID_TAG, died_reason, end_running_children, process_died
    from ghsweep.tracking.mlflow_store import MlflowStore

    store = MlflowStore(manifest.tracking_uri, manifest.experiment)
    parent = store.get_run(manifest.parent_run_id)
    if parent.status != RunStatus.RUNNING:
        # A sweep that ended before its end was recorded in its directory (an earlier ghsweep).
        children = store.search(parent_run_id=parent.run_id)
        # Its MLflow run's status says how it ended: one that FINISHED expected its failures (a tuning study's).
        ended = SweepEnd.of(children, parent.status == RunStatus.KILLED, parent.status == RunStatus.FINISHED)
        return print_end(sweep_dir, ended)
    if not process_died(parent.tags):
        print(f"ghsweep: the sweep is still running (pid {parent.tags.get(PID_TAG)}); run this again later")
        return 0
    end_running_children(store, manifest.parent_run_id, RunStatus.FAILED, died_reason(parent.tags))
    finish_sweep(sweep_dir)
    return 0


def print_end(sweep_dir: Path, ended: SweepEnd) -> int:
    """How the sweep ended; 1 when it failed (its MLflow run, or one of its runs), as the sweep's command."""
    manifest = SweepManifest.load(sweep_dir)
    run = f" (MLflow run {manifest.parent_run_id})" if manifest else ""
    print(f"ghsweep: the sweep ended {ended.status}{run}")
    if ended.failed:
        print(f"ghsweep: {len(ended.failed)} of {ended.runs} runs failed: {', '.join(ended.failed)}")
    return 1 if ended.is_failure else 0


if __name__ == "__main__":
    sys.exit(main())
