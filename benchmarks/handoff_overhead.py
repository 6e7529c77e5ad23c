"""Whether the profiler's overhead on the fp8 LoRA line depends on the nsys hand-off (issue 49): the
user's line `python -m ghsweep -m repeat=1,2 precision=bf16,fp8 model=llama2_7b train.seq_length=4096
train.micro_batch_size=1` (nsys on, its default trace set) swept once with profile.nsys.handoff=true
and once with false, on one GPU. Per run: the mean profiled step, the measured (untraced) step, the
profiler's overhead, whether the sweep's work on earlier runs was found beside its steps (the
sweep_overlap finding), and its top finding (the most severe established one, as the comparison shows).

    OUT=results python benchmarks/handoff_overhead.py [--steps 10] [--measure-steps 30] [--work /tmp/handoff]

Writes $OUT/handoff_overhead.json (each sweep's command, wall time and runs) and each sweep's log
beside it; the table is printed last. About 7 minutes on one H200 with the defaults (train.max_steps
and train.measure_max_steps kept small: the overhead needs a few steady steps, not many).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ghsweep.core.run_dir import PROFILE_ANALYSIS
from ghsweep.core.run_result import sweep_results
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.report.sweep_table import align, knob_values

LINE = ["repeat=1,2", "precision=bf16,fp8", "model=llama2_7b", "train.seq_length=4096", "train.micro_batch_size=1"]
SEVERITY_ORDER = ("warning", "info")


def top_finding(a: ProfileAnalysis) -> str:
    """The most severe finding established (report.compare.top_finding's choice), cut for the table."""
    found = [f for f in a.findings if f.evidence.get("established", True)]
    if not found:
        return "-"
    worst = min(found, key=lambda f: SEVERITY_ORDER.index(f.severity) if f.severity in SEVERITY_ORDER else 2)
    return f"{worst.id}: {worst.message[:70]}"


def runs_of(sweep: Path, handoff: bool) -> list[dict]:
    out = []
    for run_dir, result in sweep_results(sweep):
        raw = run_dir / PROFILE_ANALYSIS
        a = ProfileAnalysis.from_dict(json.loads(raw.read_text())) if raw.is_file() else None
        knobs = knob_values(result.overrides)
        out.append(
            {
                "handoff": handoff,
                "job": run_dir.name,
                "precision": knobs.get("precision"),
                "repeat": knobs.get("repeat"),
                "status": result.status,
                "profiled_step_ms": a.profiled_step_ms if a else None,
                "measured_step_ms": a.measured_step_ms if a else None,
                "profiler_overhead_pct": a.profiler_overhead_pct if a else None,
                "overlap": any(f.id == "sweep_overlap" for f in a.findings) if a else None,
                "findings": [(f.id, f.severity, f.evidence.get("established", True)) for f in a.findings] if a else [],
                "top_finding": top_finding(a) if a else f"no analysis ({result.error or result.status})",
            }
        )
    return out


def fmt(value: object, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="train.max_steps (default %(default)s)")
    parser.add_argument("--measure-steps", type=int, default=30, help="train.measure_max_steps (default %(default)s)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/handoff_overhead"), help="sweeps and MLflow store")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "results"))
    out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    sweeps, rows = [], []
    for handoff in (True, False):
        sweep_dir = args.work / f"handoff_{str(handoff).lower()}"
        command = [
            sys.executable,
            "-m",
            "ghsweep",
            "-m",
            *LINE,
            "profile=nsys",
            f"profile.nsys.handoff={str(handoff).lower()}",
            f"train.max_steps={args.steps}",
            f"train.measure_max_steps={args.measure_steps}",
            f"tracking.uri=sqlite:///{args.work / 'mlflow.db'}",
            f"hydra.sweep.dir={sweep_dir}",
        ]
        print("+ " + " ".join(command[1:]), flush=True)
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True)
        wall_s = time.monotonic() - started
        (out / f"handoff_{str(handoff).lower()}.log").write_text(done.stdout + done.stderr)
        print(f"== handoff={handoff}: exit {done.returncode}, {wall_s:.0f} s", flush=True)
        runs = runs_of(sweep_dir, handoff)
        sweeps.append({"command": command[1:], "exit": done.returncode, "wall_s": wall_s, "runs": runs})
        rows += runs
    (out / "handoff_overhead.json").write_text(json.dumps({"line": LINE, "sweeps": sweeps}, indent=1, default=str))
    header = [
        "handoff",
        "job",
        "precision",
        "repeat",
        "profiled ms",
        "measured ms",
        "overhead %",
        "overlap",
        "top finding",
    ]
    table = [
        [
            str(r["handoff"]).lower(),
            r["job"],
            fmt(r["precision"]),
            fmt(r["repeat"]),
            fmt(r["profiled_step_ms"]),
            fmt(r["measured_step_ms"]),
            fmt(r["profiler_overhead_pct"]),
            fmt(r["overlap"]),
            r["top_finding"],
        ]
        for r in rows
    ]
    print("\n" + align(header, table))
    return 0 if all(s["exit"] == 0 for s in sweeps) else 1


if __name__ == "__main__":
    sys.exit(main())
