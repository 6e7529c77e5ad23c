"""Where a sweep's wall time went, per combination: `python benchmarks/time_to_answer.py SWEEP_DIR --wall S`.

Reads each run's result.json (the job's timing), metrics.jsonl (the step times) and config.yaml (the
warm-up length) and prints one row per combination: worker start and imports, set-up (model, data,
optimizer), the first steps (compile, autotune, allocator warm-up: the loop's time outside the steady
steps) with the parts of them the worker timed (compile_s: torch.compile's tracing, compiling and
cache loads; capture_s: starting and stopping the profiler's capture window), the steady steps
themselves, the worker's exit (the profiler writing its report), the profile analysis (export, ncu
pass, report, plots) and the MLflow record. `job_s` is the run's share of the sweep's line: its job's
time until the next combination could start (on a local sweep the analysis and the record run
beside the next combination); `fixed_s` is that time less the steady steps. The sweep's own time is
the sweep's wall (`--wall`, timed by the caller) less its runs' job times: Hydra's start, the
sweep's parent run, the comparison report.

`python benchmarks/time_to_answer.py --lines JSON` prints, from what the calls above collected in JSON,
one row per line measured cold and warm (time_to_answer.sh): the sweep's wall cold and warm, the warm
sweeps' steady steps, the sweep's own time, and the fixed cost of the combinations after the first
(whose graphs an earlier combination compiled), each as the median and the spread of the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from omegaconf import OmegaConf

from ghsweep.core.run_result import RunResult, RunStatus, sweep_results

COLUMNS = (
    "startup_s",
    "setup_s",
    "device_s",
    "model_s",
    "data_s",
    "optimizer_s",
    "first_steps_s",
    "compile_s",
    "capture_s",
    "steady_s",
    "worker_exit_s",
    "analysis_s",
    "record_s",
    "wall_s",
    "job_s",
)


def steady_seconds(run_dir: Path) -> tuple[float, int]:
    """(seconds, count) of the steps after the run's train.warmup_steps, as step_time_ms counts them."""
    warmup = OmegaConf.load(run_dir / "config.yaml").train.warmup_steps
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = [row["step_time_ms"] for row in steps if row["step"] >= warmup]
    return sum(steady) / 1000, len(steady)


def run_row(run_dir: Path, result: RunResult, shared: set[str]) -> dict:
    timing = result.timing
    swept = " ".join(o for o in result.overrides if o not in shared)
    row = {"run": swept or result.name, "status": str(result.status)}
    if result.status != RunStatus.FINISHED:
        return row | {"wall_s": timing.get("wall_s")}
    steady_s, steady_steps = steady_seconds(run_dir)
    # Every column but the two worked out from the step times below is the job's own timing.
    row |= {k: timing.get(k) for k in COLUMNS if k not in ("first_steps_s", "steady_s")}
    row |= {
        "first_steps_s": timing["train_s"] - steady_s,
        "steady_s": steady_s,
        "steady_steps": steady_steps,
        # Results from before job_s: the job ended with its record.
        "fixed_s": timing.get("job_s", timing["wall_s"]) - steady_s,
        "tokens_per_s": result.metrics.get("tokens_per_s"),
    }
    return row


def sweep_rows(sweep_dir: Path) -> list[dict]:
    runs = sweep_results(sweep_dir)
    overrides = [set(result.overrides) for _, result in runs]
    # Name each run by what it sweeps: the overrides every run shares say nothing about it.
    shared = set.intersection(*overrides) if len(overrides) > 1 else set()
    return [run_row(run_dir, result, shared) for run_dir, result in runs]


def table(rows: list[dict], wall_s: float | None) -> str:
    header = ("#", "run", *COLUMNS, "fixed_s", "tokens/s")
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    for i, row in enumerate(rows):
        cells = [str(i), row["run"]]
        cells += [f"{row[c]:.1f}" if row.get(c) is not None else "-" for c in (*COLUMNS, "fixed_s")]
        cells.append(f"{row['tokens_per_s']:,.0f}" if row.get("tokens_per_s") else row["status"])
        lines.append(" | ".join(cells))
    runs_wall = sum(r.get("job_s") or r["wall_s"] or 0 for r in rows)
    fixed = [r["fixed_s"] for r in rows if "fixed_s" in r]
    lines.append("")
    steady_s = sum(r.get("steady_s", 0) for r in rows)
    lines.append(f"runs: {len(rows)}, their job times {runs_wall:.1f} s, steady steps {steady_s:.1f} s")
    if fixed:
        later = fixed[1:] or fixed
        later_s = statistics.median(later)
        lines.append(f"fixed cost per combination: first {fixed[0]:.1f} s, later median {later_s:.1f} s")
    if wall_s is not None and wall_s < runs_wall:  # runs on several GPUs at once
        lines.append(f"sweep wall {wall_s:.1f} s: its runs overlapped, {wall_s / runs_wall:.2f}x their summed times")
    elif wall_s is not None:
        own_s = wall_s - runs_wall
        lines.append(f"sweep wall {wall_s:.1f} s, of which the sweep's own time (outside its runs) {own_s:.1f} s")
    return "\n".join(lines)


def spread(values: list[float]) -> str:
    """The median of `values`, with their range when there are several."""
    if not values:
        return "-"
    median = f"{statistics.median(values):.1f} s"
    return median if len(values) == 1 else f"{median} ({min(values):.1f}-{max(values):.1f})"


def sweep_figures(sweep: dict) -> dict[str, float]:
    """A recorded sweep's wall, steady steps, own time and its later combinations' median fixed cost."""
    runs = sweep["runs"]
    jobs_s = sum(r.get("job_s") or r.get("wall_s") or 0 for r in runs)
    fixed = [r["fixed_s"] for r in runs if "fixed_s" in r]
    return {
        "wall_s": sweep["wall_s"],
        "steady_s": sum(r.get("steady_s", 0) for r in runs),
        "own_s": sweep["wall_s"] - jobs_s,
        **({"later_fixed_s": statistics.median(fixed[1:])} if len(fixed) > 1 else {}),
    }


def lines_table(sweeps: list[dict]) -> str:
    """The issue's table: each line's cold and warm wall, steady steps (warm), the sweep's own time and
    the later combinations' fixed cost (warm), median (spread) of the repeats."""
    header = ("line", "cold", "warm", "steady steps (warm)", "sweep's own time", "later fixed cost (warm)", "repeats")
    rows = [" | ".join(header), " | ".join("---" for _ in header)]
    for line in dict.fromkeys(s["line"] for s in sweeps if s.get("line")):
        figures = {
            state: [sweep_figures(s) for s in sweeps if s.get("line") == line and s.get("state") == state]
            for state in ("cold", "warm")
        }
        cold, warm = figures["cold"], figures["warm"]
        rows.append(
            " | ".join(
                (
                    line,
                    spread([f["wall_s"] for f in cold]),
                    spread([f["wall_s"] for f in warm]),
                    spread([f["steady_s"] for f in warm]),
                    spread([f["own_s"] for f in cold + warm]),
                    spread([f["later_fixed_s"] for f in warm if "later_fixed_s" in f]),
                    str(max(len(cold), len(warm))),
                )
            )
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, nargs="?")
    parser.add_argument("--wall", type=float, help="the sweep's wall time in seconds, as the caller timed it")
    parser.add_argument("--label", default="", help="a name for this sweep in the JSON (e.g. the command)")
    parser.add_argument("--json", type=Path, help="append the rows to this JSON file (a list of sweeps)")
    parser.add_argument("--line", default="", help="the line this sweep measures, for --lines")
    parser.add_argument("--state", choices=("cold", "warm"), help="its compile caches: empty, or a run's before")
    parser.add_argument("--lines", type=Path, help="print the cold/warm table of the sweeps this JSON file holds")
    args = parser.parse_args()
    if args.lines:
        print(lines_table(json.loads(args.lines.read_text())))
        return
    if args.sweep_dir is None:
        parser.error("a sweep directory, or --lines JSON")
    rows = sweep_rows(args.sweep_dir)
    print(table(rows, args.wall))
    if args.json:
        sweeps = json.loads(args.json.read_text()) if args.json.exists() else []
        sweep = {"label": args.label, "sweep_dir": str(args.sweep_dir), "wall_s": args.wall, "runs": rows}
        sweeps.append(sweep | ({"line": args.line, "state": args.state} if args.state else {}))
        args.json.write_text(json.dumps(sweeps, indent=2))


if __name__ == "__main__":
    main()
