"""What the analysis says about why, from sweeps benchmarks/diagnosis.sh ran: the profiler's overhead
per run, the findings of each repeat of a combination side by side, and `python -m ghsweep.analyze
RUN --against BASELINE` for fp8 against bf16 (each repeat) and 2 GPUs against 1, with the sum of
the parts against the step difference.

    python benchmarks/diagnosis.py SWEEP_DIR... --out diagnosis.json [--exports DIR]

Each SWEEP_DIR is a Hydra sweep directory (<job>/result.json, profile_analysis.json, summary.json).
--exports keeps the exports of the compared runs, trimmed and gzipped (benchmarks/scaling_profiles.py),
in DIR/<sweep>_<job>/profile_rank<R>.sqlite.gz. The tables are printed last.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from ghsweep.core.run_dir import PROFILE_ANALYSIS
from ghsweep.core.run_result import sweep_results
from ghsweep.profile import delta
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.profile.scaling import decompose, scale_out_finding
from ghsweep.report.sweep_table import align, knob_values

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaling_profiles import RANK_FILE, exports_of, trimmed  # noqa: E402 - a sibling script

WORLD = "backend.gpus_per_node"


def runs_of(sweep: Path) -> list[dict]:
    out = []
    for run_dir, result in sweep_results(sweep):
        raw = run_dir / PROFILE_ANALYSIS
        analysis = ProfileAnalysis.from_dict(json.loads(raw.read_text())) if raw.is_file() else None
        knobs = knob_values([o for o in result.overrides if not o.startswith(("hydra.", "tracking."))])
        out.append({"sweep": sweep.name, "dir": run_dir, "knobs": knobs, "result": result, "analysis": analysis})
    for r in out:  # what a label names: the knobs that vary within the sweep
        r["varying"] = {k: v for k, v in r["knobs"].items() if len({o["knobs"].get(k) for o in out}) > 1}
    return out


def label(run: dict) -> str:
    return f"{run['sweep']}#{run['dir'].name} " + " ".join(f"{k}={v}" for k, v in sorted(run["varying"].items()))


def cli_delta(run: dict, base: dict) -> dict:
    """`python -m ghsweep.analyze RUN --against BASELINE --json`'s step_delta (run directories)."""
    done = subprocess.run(
        [sys.executable, "-m", "ghsweep.analyze", str(run["dir"]), "--against", str(base["dir"]), "--json"],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        return {"error": done.stderr.strip()[-500:]}
    return json.loads(done.stdout)["step_delta"]


def pair_row(name: str, d: dict) -> list[str]:
    if "error" in d:
        return [name, "-", "-", "-", "-", d["error"][:80]]
    return [
        name,
        f"{d['difference_ms']:+.2f}",
        f"{sum(d['parts'].values()):+.2f}",
        f"{d['measured_difference_ms']:+.2f}" if "measured_difference_ms" in d else "-",
        f"{d['parts']['profiler_overhead_ms']:+.2f}",
        delta.because(d),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--exports", type=Path, default=None)
    args = parser.parse_args()
    runs = [r for sweep in args.sweeps for r in runs_of(sweep)]
    done = [r for r in runs if r["result"].status == "FINISHED" and r["analysis"] is not None]

    overhead_rows: list[list[str]] = []
    record: dict = {"runs": [], "repeats": [], "pairs": {}}
    for r in runs:
        a: ProfileAnalysis | None = r["analysis"]
        ids = [f.id for f in a.findings] if a else []
        overhead_rows.append(
            [
                label(r),
                r["result"].status,
                f"{a.measured_step_ms:.1f}" if a and a.measured_step_ms else "-",
                f"{a.profiled_step_ms:.1f}" if a and a.profiled_step_ms else "-",
                f"{a.profiler_overhead_pct:+.1f}%" if a and a.profiler_overhead_pct is not None else "-",
                f"{a.gpu_idle_pct:.1f}" if a and a.gpu_idle_pct is not None else "-",
                ",".join(ids) or "none",
            ]
        )
        record["runs"].append(
            {
                "run": label(r),
                "status": r["result"].status,
                "measured_step_ms": a.measured_step_ms if a else None,
                "profiled_step_ms": a.profiled_step_ms if a else None,
                "profiler_overhead_pct": a.profiler_overhead_pct if a else None,
                "gpu_idle_pct": a.gpu_idle_pct if a else None,
                "findings": [{"id": f.id, "severity": f.severity, "message": f.message} for f in a.findings]
                if a
                else [],
            }
        )

    # The same combination's repeats (knobs less `repeat`), their findings side by side.
    groups: dict[tuple, list[dict]] = {}
    for r in done:
        if "repeat" in r["knobs"]:
            key = (r["sweep"], tuple(sorted((k, v) for k, v in r["knobs"].items() if k != "repeat")))
            groups.setdefault(key, []).append(r)
    repeat_rows = []
    for (sweep, key), group in groups.items():
        found = [sorted({(f.id, f.severity) for f in g["analysis"].findings}) for g in group]
        ids = [sorted({i for i, _ in f}) for f in found]
        same = all(i == ids[0] for i in ids)
        words = " ".join(f"{k}={v}" for k, v in key)
        repeat_rows.append(
            [f"{sweep} {words}", " | ".join(",".join(i) or "none" for i in ids), "yes" if same else "NO"]
        )
        record["repeats"].append({"combination": words, "findings": found, "same_ids": same})

    pair_rows = []

    def compare(name: str, base: dict, run: dict) -> None:
        d = cli_delta(run, base)
        in_process = delta.step_delta(base["analysis"], run["analysis"])
        record["pairs"][name] = {"cli": d, "from_saved_analyses": in_process}
        pair_rows.append(pair_row(name, d))
        if args.exports is not None:
            for r in (base, run):
                for rank, export in enumerate(exports_of(r["dir"])):
                    trimmed(export, args.exports / f"{r['sweep']}_{r['dir'].name}" / RANK_FILE.format(rank=rank))

    for r in done:  # fp8 against bf16, the same repeat and everything else
        if r["knobs"].get("precision") != "fp8":
            continue
        twin = {**r["knobs"], "precision": "bf16"}
        base = next((b for b in done if b["knobs"] == twin and b["sweep"] == r["sweep"]), None)
        if base is not None:
            compare(f"fp8 vs bf16 ({label(r)})", base, r)
    scale_rows = []
    for r in done:  # N GPUs against 1
        if int(r["knobs"].get(WORLD, "1")) <= 1:
            continue
        twin = {**r["knobs"], WORLD: "1"}
        base = next((b for b in done if b["knobs"] == twin and b["sweep"] == r["sweep"]), None)
        if base is None:
            continue
        compare(f"{r['knobs'][WORLD]} vs 1 GPU ({label(r)})", base, r)
        d = decompose(base["analysis"], r["analysis"])
        f = scale_out_finding(d, label(r), r["knobs"], base["result"].metrics.get("peak_mem_gb"))
        record["pairs"][f"scale-out {label(r)}"] = {"finding": f.message, "levers": f.evidence["levers"]}
        scale_rows.append([label(r), f.message])

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, default=str))
    print("\n== profiler overhead per run (profiled steps against the run's own untraced steps)")
    print(align(["run", "status", "measured ms", "profiled ms", "overhead", "GPU idle %", "findings"], overhead_rows))
    print("\n== findings per repeat (ids; severities in the JSON)")
    print(align(["combination", "findings of each repeat", "same"], repeat_rows))
    print("\n== analyze --against: where the step time went (ms per step)")
    print(
        align(
            ["pair", "difference", "sum of parts", "measured difference", "profiler part", "because (by family)"],
            pair_rows,
        )
    )
    for row in scale_rows:
        print(f"\nscale-out {row[0]}: {row[1]}")
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
