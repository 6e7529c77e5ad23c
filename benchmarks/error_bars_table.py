"""The error-bar targets from what benchmarks/error_bars.sh left in OUT; writes OUT/error_bars.json.

    python benchmarks/error_bars_table.py OUT

Prints a table last: the bench's and the CLI's tokens/s with their 95% intervals and whether they
overlap, the spread of the three CLI repeats and of the repeats sweep, each sweep run's half-width and
why it stopped, the sweep's wall time against the fixed-length one, and the comparison's line for bf16
offload on vs off.
A part not run yet shows as "not measured".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ghsweep.core import stats
from ghsweep.core.run_dir import RESULT, SUMMARY

REPEATS_PCT = 0.5  # target: the three repeats within this spread
HALF_WIDTH_PCT = 1.0  # target: each sweep run's tokens/s half-width at most this
WALL_RATIO = 1.15  # target: the measuring sweep's wall time at most this times the fixed-length one's


def tokens(metrics: dict) -> stats.Interval | None:
    return stats.from_metrics(metrics, "tokens_per_s")


def fmt(i: stats.Interval | None) -> str:
    if i is None:
        return "not measured"
    return (
        f"{i.estimate:,.0f} [{i.low:,.0f}, {i.high:,.0f}] ±{i.half_width_pct:.2f}%" if i.known else f"{i.estimate:,.0f}"
    )


def sweep_runs(sweep: Path) -> list[dict]:
    runs = []
    for run_dir in sorted((p for p in sweep.glob("*") if (p / RESULT).exists()), key=lambda p: p.name):
        result = json.loads((run_dir / RESULT).read_text())
        info = json.loads((run_dir / SUMMARY).read_text())["info"] if (run_dir / SUMMARY).exists() else {}
        runs.append(
            {
                "overrides": " ".join(o for o in result["overrides"] if o.startswith(("precision=", "offload="))),
                "status": result["status"],
                "metrics": result["metrics"],
                "measure_stop": info.get("measure_stop"),
                "device_name": info.get("device_name"),
            }
        )
    return runs


def wall(out: Path, name: str) -> float | None:
    path = out / f"{name}_wall_s"
    return float(path.read_text()) if path.exists() else None


def main(out: Path) -> int:
    rows: list[tuple[str, str, str]] = []  # (what, measured, target met?)
    record: dict = {}
    bench_file = out / "bench.json"
    bench = json.loads(bench_file.read_text())["rows"].get("ours_lora_bf16") if bench_file.exists() else None
    bench_i = tokens(bench) if bench and bench.get("ok") else None
    cli = [
        json.loads((out / f"cli_{r}" / SUMMARY).read_text()) for r in (1, 2, 3) if (out / f"cli_{r}" / SUMMARY).exists()
    ]
    cli_i = [tokens(s["metrics"]) for s in cli]
    record["bench"], record["cli"] = bench, [s["metrics"] for s in cli]
    rows.append(("bench ours_lora_bf16 tokens/s", fmt(bench_i), ""))
    for n, i in enumerate(cli_i, 1):
        stop = cli[n - 1]["info"].get("measure_stop")
        rows.append((f"CLI repeat {n} tokens/s ({stop})", fmt(i), ""))
    if bench_i and cli_i and cli_i[0] and bench_i.known and cli_i[0].known:
        overlap = bench_i.low <= cli_i[0].high and cli_i[0].low <= bench_i.high
        rows.append(
            ("bench and CLI intervals overlap", f"{stats.ratio(cli_i[0], bench_i).estimate:.4f}x", str(overlap))
        )
        record["bench_cli_overlap"] = overlap
    if len(cli_i) == 3 and all(cli_i):
        estimates = [i.estimate for i in cli_i if i]
        spread = stats.spread_pct(estimates)
        combined = stats.combine_repeats(estimates, [i for i in cli_i if i])
        rows.append(("3 repeats: spread (max-min)/mean", f"{spread:.2f}%", str(spread <= REPEATS_PCT)))
        rows.append(("3 repeats combined", fmt(combined), ""))
        record["repeats_spread_pct"] = spread
    repeats = sweep_runs(out / "repeats") if (out / "repeats").is_dir() else []
    record["repeats"] = repeats
    repeat_i = [tokens(r["metrics"]) for r in repeats if r["status"] == "FINISHED"]
    if len(repeat_i) == 3 and all(repeat_i):
        estimates = [i.estimate for i in repeat_i if i]
        spread = stats.spread_pct(estimates)
        widest = max(i.half_width_pct for i in repeat_i if i)
        rows.append(
            (
                f"3 sweep repeats {repeats[0]['overrides']}, each ±{widest:.2f}% or closer",
                f"{spread:.2f}% apart",
                str(spread <= REPEATS_PCT),
            )
        )
        record["sweep_repeats_spread_pct"] = spread
    for name in ("sweep", "sweep_today"):
        runs = sweep_runs(out / name) if (out / name).is_dir() else []
        record[name] = runs
        for r in runs:
            i = tokens(r["metrics"]) if r["status"] == "FINISHED" else None
            met = str(i.half_width_pct <= HALF_WIDTH_PCT) if name == "sweep" and i and i.known else ""
            rows.append((f"{name} {r['overrides']} ({r['measure_stop']})", fmt(i) if i else r["status"], met))
    new, today = wall(out, "sweep"), wall(out, "sweep_today")
    if new and today:
        rows.append(
            (
                "sweep wall time vs fixed length",
                f"{new:.0f} s vs {today:.0f} s = {new / today:.3f}x",
                str(new / today <= WALL_RATIO),
            )
        )
        record["wall_ratio"] = new / today
    comparison = out / "sweep" / "comparison" / "comparison.md"
    if comparison.exists():
        lines = [
            line for line in comparison.read_text().splitlines() if "bf16 on" in line and "against the baseline" in line
        ]
        record["bf16_on_vs_off"] = lines
        rows += [("comparison", line, "") for line in lines]
    devices = {r.get("device_name") for name in ("sweep", "sweep_today", "repeats") for r in record[name]}
    devices |= {s["info"].get("device_name") for s in cli}
    record["devices"] = sorted(d for d in devices if d)
    (out / "error_bars.json").write_text(json.dumps(record, indent=1) + "\n")
    width = max(len(w) for w, _, _ in rows)
    print(f"devices: {', '.join(record['devices']) or 'unknown'}")
    print(f"{'what':<{width}}  {'measured':<48}  target met")
    for what, measured, met in rows:
        print(f"{what:<{width}}  {measured:<48}  {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
