"""Follow and collect a sweep submitted with `wait=false`.

    python -m ghsweep.status SWEEP_DIR           # each job's SLURM state; collects once all ended
    python -m ghsweep.status SWEEP_DIR --wait    # block until every job ended, then collect

Collecting is what a waiting sweep does at its end: jobs that ended without recording themselves
(cancelled, killed at the time limit) are recorded FAILED/KILLED in MLflow with their SLURM log, the
summary table is printed and the sweep's MLflow run is ended. The exit status is non-zero when a
run failed, as for a waiting sweep.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ghsweep.launch.callbacks import finish_sweep
from ghsweep.launch.slurm_jobs import JOBS_FILE, has_ended, load_jobs, settle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ghsweep.status", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="the sweep directory (printed when it was submitted)")
    parser.add_argument("--wait", action="store_true", help="wait until every job ended, then collect")
    parser.add_argument("--poll-s", type=float, default=10.0, help="seconds between looks with --wait")
    args = parser.parse_args(argv)
    submitted = load_jobs(args.sweep_dir)
    if not submitted:
        parser.error(f"{args.sweep_dir}: no submitted jobs recorded ({JOBS_FILE}); accepted: the directory of a "
                     "sweep launched with a SLURM profile")
    jobs = [(s, s.submitit_job()) for s in submitted]
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

    settle(args.sweep_dir, jobs)
    finish_sweep(args.sweep_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
