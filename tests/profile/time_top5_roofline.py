"""Time the course assignment on Llama-2-7B on one GPU: the top5_roofline preset (fp32 vs bf16,
each under nsys, then an Nsight Compute pass over a few launches of its top-5 kernels) and its
assignment report, as a user runs them. The target: the whole sweep and report in under 6 minutes,
with a roofline point for each of the five top kernels of each run.

    OUT=DIR python tests/profile/time_top5_roofline.py [--nsys PATH] [--ncu PATH] [OVERRIDE ...]

Writes $OUT/top5_roofline.json (wall times; per run: status, step time, ncu_s, what the ncu pass
profiled, roofline points and the top kernels without one), $OUT/assignment.md and
$OUT/sweep_tail.log, and prints a table last. Not run in CI (needs a GPU, nsys and ncu).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET_S = 360


def timed(cmd: list[str], cwd: Path, log: Path) -> tuple[int, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        code = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    return code, time.monotonic() - started


def run_facts(job_dir: Path) -> dict:
    facts: dict = {
        "job": job_dir.name,
        "overrides": (job_dir / "overrides.yaml").read_text().strip().splitlines()
        if (job_dir / "overrides.yaml").exists()
        else [],
    }
    if (job_dir / "summary.json").exists():
        facts["step_time_ms"] = json.loads((job_dir / "summary.json").read_text())["metrics"].get("step_time_ms")
    analysis_file = job_dir / "profile_analysis.json"
    if analysis_file.exists():
        a = json.loads(analysis_file.read_text())
        roof = a.get("roofline", {})
        facts |= {
            "steps": a["window"]["steps"],
            "top_kernels": [k["short_name"] for k in a["top_kernels"]],
            "roofline_points": len(roof.get("kernels", [])),
            "missing": roof.get("missing"),
            "ncu_pass": roof.get("ncu_pass"),
            "findings": [f["id"] for f in a.get("findings", [])],
        }
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nsys", default=None, help="profile.nsys.path (default: nsys on PATH)")
    parser.add_argument("--ncu", default=None, help="profile.ncu.path (default: ncu on PATH)")
    parser.add_argument("overrides", nargs="*", help="more ghsweep overrides (e.g. model.path=...)")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "top5_out")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="top5_"))
    log = work / "sweep.log"
    store = f"sqlite:///{work}/mlflow.db"
    sweep = [
        sys.executable,
        "-m",
        "ghsweep",
        "-m",
        "experiment=top5_roofline",
        "tracking=sqlite",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={work}/top5/sweep",
    ]
    sweep += [f"profile.nsys.path={args.nsys}"] if args.nsys else []
    sweep += [f"profile.ncu.path={args.ncu}"] if args.ncu else []
    sweep_code, sweep_s = timed(sweep + args.overrides, work, log)
    report = [
        sys.executable,
        "-m",
        "ghsweep.report",
        "--assignment",
        "sweep top5/sweep",
        "--out",
        str(work / "asg"),
        "--tracking-uri",
        store,
    ]
    report_code, report_s = timed(report, work, log)
    runs = [run_facts(d) for d in sorted((work / "top5" / "sweep").glob("[0-9]*"))]
    result = {
        "sweep_exit": sweep_code,
        "sweep_s": sweep_s,
        "report_exit": report_code,
        "report_s": report_s,
        "total_s": sweep_s + report_s,
        "target_s": TARGET_S,
        "runs": runs,
    }
    (out / "top5_roofline.json").write_text(json.dumps(result, indent=2))
    if (work / "asg" / "assignment.md").exists():
        (out / "assignment.md").write_text((work / "asg" / "assignment.md").read_text())
    (out / "sweep_tail.log").write_text("\n".join(log.read_text().splitlines()[-300:]))
    shutil.rmtree(work, ignore_errors=True)  # 7B runs leave large nsys reports

    rows = [("run", "step ms", "ncu_s", "ncu profiled", "roofline points", "top kernels without a point")]
    for r in runs:
        ncu = r.get("ncu_pass") or {}
        rows.append(
            (
                r["overrides"][0].lstrip("- ") if r["overrides"] else r["job"],
                f"{r.get('step_time_ms') or 0:.0f}",
                f"{ncu.get('seconds', 0):.0f}",
                ncu.get("launches", "-"),
                str(r.get("roofline_points", "-")),
                ", ".join(r.get("missing") or []) or "none",
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)))
    verdict = "within" if result["total_s"] < TARGET_S and not sweep_code and not report_code else "NOT within"
    print(
        f"sweep {sweep_s:.0f} s (exit {sweep_code}) + assignment report {report_s:.0f} s (exit {report_code}) = "
        f"{result['total_s']:.0f} s: {verdict} the {TARGET_S} s target"
    )


if __name__ == "__main__":
    main()
