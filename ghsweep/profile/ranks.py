"""One run on several GPUs: every rank's Nsight Systems report analysed, and what they say together.

Each rank's report gets the single-GPU analysis (its own steady window, busy/idle time, top
kernels, communication: analysis.nccl_communication). The run's analysis is rank 0's, with:
- `ranks`: one row per rank (device busy/idle, NCCL share, exposed communication, step and
  compute time per step);
- the run's metrics over the ranks: gpu_busy_pct / gpu_idle_pct, nccl_time_pct and
  exposed_nccl_pct are means over the ranks;
- findings: a straggler (one rank's compute per step well above the median rank's: the others
  wait for it in every collective), and exposed communication (the GPUs idle on NCCL for a
  share of the window the overlap of data parallelism should hide).
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from ghsweep.profile.findings import finding

# A rank whose compute per step is this much above the median rank's is a straggler.
STRAGGLER_MIN_PCT = 10.0
# Communication no compute kernel overlaps, % of the window, worth a finding.
EXPOSED_COMM_MIN_PCT = 10.0
RANK_IN_NAME = re.compile(r"rank(\d+)")
AVERAGED = ("gpu_busy_pct", "gpu_idle_pct", "nccl_time_pct", "exposed_nccl_pct")


def rank_of(path: Path) -> int:
    """The rank in a per-rank report's name (profile_rank3.sqlite -> 3)."""
    found = RANK_IN_NAME.search(path.name)
    if not found:
        raise ValueError(f"{path}: no rank in the file name; expected profile_rank<N>.sqlite")
    return int(found.group(1))


def rank_row(rank: int, path: Path, a: dict) -> dict:
    comm = a.get("communication") or {}
    return {
        "rank": rank,
        "profile": path.name,
        "gpu_busy_pct": a.get("gpu_busy_pct"),
        "gpu_idle_pct": a.get("gpu_idle_pct"),
        "nccl_time_pct": comm.get("nccl_time_pct", 0.0),
        "exposed_nccl_pct": comm.get("exposed_nccl_pct", 0.0),
        "step_ms": (a.get("step_ms") or {}).get("median"),
        "compute_ms_per_step": comm.get("compute_ms_per_step"),
    }


def combine(per_rank: dict[int, tuple[Path, dict]], world_size: int) -> dict:
    """The run's analysis from each rank's ({rank: (report, analysis)}); rank 0's (else the lowest's)
    is the base, the rows, means and findings are added."""
    ranks = sorted(per_rank)
    result = dict(per_rank[ranks[0]][1])
    rows = [rank_row(r, *per_rank[r]) for r in ranks]
    result["ranks"] = rows
    for key in AVERAGED:
        values = [row[key] for row in rows if row[key] is not None]
        result[key] = statistics.fmean(values) if values else None
    missing = sorted(set(range(world_size)) - set(ranks))
    extra = []
    if missing:
        extra.append(finding("profile_health", "warning",
                             f"no profile of rank(s) {', '.join(map(str, missing))} of {world_size}: the analysis "
                             "covers the others only", missing_ranks=missing))
    extra += rank_findings(rows)
    result["findings"] = [*result.get("findings", []), *extra]
    result["summary"] = [*result.get("summary", []), ranks_summary(rows)]
    return result


def rank_findings(rows: list[dict]) -> list[dict]:
    out = []
    # Compute per step tells the straggler: the others' steps last as long, waiting in the collectives.
    key = "compute_ms_per_step" if all(r["compute_ms_per_step"] for r in rows) else "step_ms"
    times = [r[key] for r in rows if r[key]]
    if len(times) == len(rows) > 1:
        middle = statistics.median(times)
        slowest = max(rows, key=lambda r: r[key])
        over = 100.0 * (slowest[key] - middle) / middle if middle else 0.0
        if over >= STRAGGLER_MIN_PCT:
            what = "computes" if key == "compute_ms_per_step" else "steps take"
            out.append(finding("straggler", "warning",
                               f"rank {slowest['rank']} is a straggler: it {what} {slowest[key]:.1f} ms per step against "
                               f"a median of {middle:.1f} ms over the {len(rows)} ranks (+{over:.0f}%); the other ranks "
                               "wait for it in every collective (a slower GPU, a throttled or shared device, or "
                               "uneven data)", rank=slowest["rank"], ms_per_step=slowest[key], median_ms=middle,
                               over_pct=over))
    exposed = [r["exposed_nccl_pct"] for r in rows if r["exposed_nccl_pct"] is not None]
    if exposed and statistics.fmean(exposed) >= EXPOSED_COMM_MIN_PCT:
        worst = max(rows, key=lambda r: r["exposed_nccl_pct"] or 0.0)
        out.append(finding("exposed_communication", "warning",
                           f"communication is exposed: NCCL kernels run with no compute beside them for "
                           f"{statistics.fmean(exposed):.1f}% of the steady state on average (rank {worst['rank']}: "
                           f"{worst['exposed_nccl_pct']:.1f}%); the GPUs wait for gradients or parameters (larger "
                           "buckets or micro-batches, FSDP prefetch, or a faster link)",
                           exposed_nccl_pct=statistics.fmean(exposed), worst_rank=worst["rank"]))
    return out


def ranks_summary(rows: list[dict]) -> str:
    parts = [f"rank {r['rank']}: busy {r['gpu_busy_pct']:.1f}%, NCCL {r['nccl_time_pct']:.1f}% of kernel time, "
             f"exposed {r['exposed_nccl_pct']:.1f}%" for r in rows if r["gpu_busy_pct"] is not None]
    return f"{len(rows)} ranks profiled; " + "; ".join(parts)


def table(rows: list[dict]) -> str:
    """The per-rank table of the profile report (markdown)."""
    lines = ["| rank | GPU busy % | GPU idle % | NCCL % of kernel time | exposed NCCL % | step ms | compute ms/step |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r[k] for k in ("gpu_busy_pct", "gpu_idle_pct", "nccl_time_pct", "exposed_nccl_pct", "step_ms",
                                "compute_ms_per_step")]
        lines.append(f"| {r['rank']} | " + " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"
