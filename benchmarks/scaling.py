"""Scaling efficiency of a sweep that runs the same combinations on 1 and on N GPUs.

    python benchmarks/scaling.py SWEEP_DIR [--out scaling.json] [--command "..."]

Reads each run's result.json; efficiency = tokens/s per GPU at N GPUs over tokens/s at 1 GPU of
the same combination (the overrides without backend.gpus_per_node / backend.num_nodes). Prints a
table last.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ghsweep.core.run_dir import RESULT
from ghsweep.core.run_result import RunResult
from ghsweep.report.compare import WORLD_KEYS, scaling_efficiency

ROW_METRICS = (
    "world_size",
    "step_time_ms",
    "step_time_ms_ci_pct",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "peak_mem_gb",
    "slowest_rank",
    "rank_spread_pct",
    "nccl_time_pct",
    "exposed_nccl_pct",
)


def rows(sweep_dir: Path) -> list[dict]:
    results = [RunResult.load(p.parent) for p in sorted(sweep_dir.glob(f"*/{RESULT}"))]
    runs = [
        {"overrides": r.overrides, "status": r.status, "error": r.error, **{k: r.metrics.get(k) for k in ROW_METRICS}}
        for r in results
    ]
    finished = [(r["overrides"], r if r["status"] == "FINISHED" else None) for r in runs]
    for run, eff in zip(runs, scaling_efficiency(finished)):
        run["scaling_efficiency"] = eff
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--command", default="")
    args = parser.parse_args()
    runs = rows(args.sweep_dir)
    if args.out:
        args.out.write_text(json.dumps({"command": args.command, "runs": runs}, indent=2))
    print(
        f"{'combination':<58} {'status':<9} {'GPUs':>4} {'step ms':>8} {'±%':>5} {'tok/s':>8} {'tok/s/GPU':>9} "
        f"{'eff':>5} {'peak GiB':>8} {'NCCL %':>6} {'exposed %':>9}"
    )
    for r in runs:
        combo = " ".join(o for o in r["overrides"] if not o.startswith(WORLD_KEYS) and "sweep" not in o)[:58]
        cells = [
            r["world_size"],
            r["step_time_ms"],
            r["step_time_ms_ci_pct"],
            r["tokens_per_s"],
            r["tokens_per_s_per_gpu"],
            r["scaling_efficiency"],
            r["peak_mem_gb"],
            r["nccl_time_pct"],
            r["exposed_nccl_pct"],
        ]
        shown = ["-" if c is None else f"{c:.2f}" if isinstance(c, float) and c < 10 else f"{c:.0f}" for c in cells]
        print(
            f"{combo:<58} {r['status']:<9} {shown[0]:>4} {shown[1]:>8} {shown[2]:>5} {shown[3]:>8} {shown[4]:>9} "
            f"{shown[5]:>5} {shown[6]:>8} {shown[7]:>6} {shown[8]:>9}"
        )
        if r["error"]:
            print(f"    error: {r['error'][:300]}")


if __name__ == "__main__":
    main()
