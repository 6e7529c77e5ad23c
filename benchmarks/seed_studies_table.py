"""The data-loader study's table from what benchmarks/seed_studies.sh left in OUT; writes OUT/seed_studies.json.

    python benchmarks/seed_studies_table.py OUT

One row per run of each sweep (dataloader: the 7B preset; short: the tiny model's short steps): tokens/s with
its 95% interval, step time, GPU idle % of the profiled steps, the data-loading finding (or none), the
card; then the comparison's verdict of num_workers=4 against num_workers=0. Prints the table last.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ghsweep.core import stats
from ghsweep.core.run_dir import COMPARISON_DIR, COMPARISON_STEM, PROFILE_ANALYSIS, RESULT, SUMMARY

SWEEPS = {"dataloader": "Llama-2-7B shape, seq 4096, mbs 1", "short": "tiny model, seq 2048, mbs 8"}


def interval_text(i: stats.Interval | None, unit: str = "") -> str:
    if i is None:
        return "not measured"
    if not i.known:
        return f"{i.estimate:,.1f}{unit}"
    return f"{i.estimate:,.1f}{unit} [{i.low:,.1f}, {i.high:,.1f}] ±{i.half_width_pct:.1f}%"


def run_rows(sweep: Path) -> list[dict]:
    rows = []
    for run_dir in sorted((p for p in sweep.glob("*") if (p / RESULT).exists()), key=lambda p: p.name):
        result = json.loads((run_dir / RESULT).read_text())
        info = json.loads((run_dir / SUMMARY).read_text())["info"] if (run_dir / SUMMARY).exists() else {}
        analysis = json.loads((run_dir / PROFILE_ANALYSIS).read_text()) if (run_dir / PROFILE_ANALYSIS).exists() else {}
        findings = analysis.get("findings", [])
        loading = [f["message"] for f in findings if f["id"] == "data_loading"]
        metrics = result["metrics"]
        rows.append(
            {
                "num_workers": next(
                    (o.split("=")[1] for o in result["overrides"] if o.startswith("dataloader.num_workers=")), "?"
                ),
                "status": result["status"],
                "tokens_per_s": interval_text(stats.from_metrics(metrics, "tokens_per_s")),
                "step_time_ms": interval_text(stats.from_metrics(metrics, "step_time_ms"), " ms"),
                "gpu_idle_pct": metrics.get("gpu_idle_pct"),
                "profiled_steps": len(analysis.get("window", {}).get("steps") or []),
                "data_loading_finding": loading[0] if loading else None,
                "findings": [f["id"] for f in findings],
                "device_name": info.get("device_name"),
                "metrics": metrics,
            }
        )
    return rows


def verdicts(sweep: Path) -> list[str]:
    comparison = sweep / COMPARISON_DIR / f"{COMPARISON_STEM}.md"
    if not comparison.exists():
        return []
    return [line for line in comparison.read_text().splitlines() if "against the baseline" in line]


def main(out: Path) -> int:
    record: dict = {}
    lines: list[str] = []
    for name, shape in SWEEPS.items():
        sweep = out / name
        if not sweep.is_dir():
            continue
        wall = out / f"{name}_wall_s"
        rows, said = run_rows(sweep), verdicts(sweep)
        record[name] = {"shape": shape, "wall_s": float(wall.read_text()) if wall.exists() else None, "runs": rows}
        record[name]["comparison"] = said
        lines.append(f"\n{name}: {shape}, data.prepare=on_the_fly (sweep wall {record[name]['wall_s']} s)")
        lines.append("| num_workers | tokens/s (95% interval) | step time | GPU idle % | data-loading finding | card |")
        lines.append("|---|---|---|---|---|---|")
        for r in rows:
            idle = "-" if r["gpu_idle_pct"] is None else f"{r['gpu_idle_pct']:.1f} ({r['profiled_steps']} steps)"
            finding = r["data_loading_finding"] or f"none (findings: {', '.join(r['findings']) or 'none'})"
            tokens = r["tokens_per_s"] if r["status"] == "FINISHED" else r["status"]
            lines.append(
                f"| {r['num_workers']} | {tokens} | {r['step_time_ms']} | {idle} | {finding} | {r['device_name']} |"
            )
        lines += [f"comparison: {line}" for line in said]
    (out / "seed_studies.json").write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(lines) if lines else f"nothing measured in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
