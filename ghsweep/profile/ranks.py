"""One run on several GPUs: every rank's Nsight Systems report analysed, and what they say together.

Each rank's report gets the single-GPU analysis (its own steady window, busy/idle time, top
kernels, communication: nsys_analysis.nccl_communication). The run's analysis is rank 0's, with:
- `ranks`: one row per rank (device busy/idle, NCCL share, exposed communication, step and
  compute time per step);
- the run's metrics over the ranks: gpu_busy_pct / gpu_idle_pct, nccl_time_pct and
  exposed_nccl_pct are means over the ranks;
- findings: a straggler, and exposed communication (the GPUs idle on NCCL for a share of the
  window the overlap of data parallelism should hide).

A straggler costs step time only where the others wait on the critical path. NCCL kernel time is
not that: a rank that launched its collective early runs the NCCL kernel beside its own compute,
and that overlapped time is lost by nobody. So the straggler is the rank with the most compute
per step (busy time of its non-NCCL work), and the time lost to it, per other rank, is the
smaller of (a) its compute beyond that rank's and (b) that rank's exposed time (NCCL with no
compute beside it, plus GPU idle) beyond the straggler's: the wait that shows. The finding
quotes the median over the other ranks, in ms per step, when it is STRAGGLER_MIN_PCT of the step.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from ghsweep.profile.findings import finding
from ghsweep.profile.result import Finding, ProfileAnalysis

# The others lose this share of a step (or more) waiting for the rank with the most compute: a straggler.
STRAGGLER_MIN_PCT = 5.0
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


def rank_row(rank: int, path: Path, a: ProfileAnalysis) -> dict:
    comm = a.communication
    steps = len(a.window.get("steps") or []) or 1
    window_ms = a.window.get("duration_ns", 0) / steps / 1e6  # the mean steady step, as the window has it
    return {
        "rank": rank,
        "profile": path.name,
        "gpu_busy_pct": a.gpu_busy_pct,
        "gpu_idle_pct": a.gpu_idle_pct,
        "nccl_time_pct": comm.get("nccl_time_pct", 0.0),
        "exposed_nccl_pct": comm.get("exposed_nccl_pct", 0.0),
        "step_ms": a.step_ms.get("median"),
        "nccl_ms_per_step": comm.get("nccl_ms_per_step"),
        "compute_ms_per_step": comm.get("compute_ms_per_step"),
        # Time this rank's GPU waits: NCCL running alone, and nothing running.
        "exposed_wait_ms_per_step": (comm.get("exposed_nccl_pct", 0.0) + (a.gpu_idle_pct or 0.0)) * window_ms / 100,
        "window_ms_per_step": window_ms,
        "time_per_step": a.time_per_step,  # scaling.py splits the step of each rank
    }


def combine(per_rank: dict[int, tuple[Path, ProfileAnalysis]], world_size: int) -> ProfileAnalysis:
    """The run's analysis from each rank's ({rank: (report, analysis)}); rank 0's (else the lowest's)
    is the base, the rows, means and findings are added."""
    ranks = sorted(per_rank)
    rows = [rank_row(r, *per_rank[r]) for r in ranks]
    # Values for the AVERAGED fields of the analysis (float | None each), passed to replace() by name.
    means: dict[str, Any] = {
        key: statistics.fmean(values) if (values := [row[key] for row in rows if row[key] is not None]) else None
        for key in AVERAGED
    }
    result = replace(per_rank[ranks[0]][1], ranks=rows, **means)
    missing = sorted(set(range(world_size)) - set(ranks))
    extra = []
    if missing:
        extra.append(
            finding(
                "profile_health",
                "warning",
                f"no profile of rank(s) {', '.join(map(str, missing))} of {world_size}: the analysis "
                "covers the others only",
                missing_ranks=missing,
            )
        )
    extra += rank_findings(rows)
    result.findings = [*result.findings, *extra]
    result.summary = [*result.summary, ranks_summary(rows)]
    return result


def straggler(rows: list[dict]) -> Finding | None:
    """The straggler finding (see the module's docstring), None when no rank costs the others
    STRAGGLER_MIN_PCT of a step."""
    measured = [r for r in rows if r["compute_ms_per_step"] is not None and r["window_ms_per_step"]]
    if len(measured) != len(rows) or len(rows) < 2:
        return None
    slowest = max(measured, key=lambda r: r["compute_ms_per_step"])
    others = [r for r in measured if r is not slowest]
    lost = [
        max(
            0.0,
            min(
                slowest["compute_ms_per_step"] - r["compute_ms_per_step"],
                r["exposed_wait_ms_per_step"] - slowest["exposed_wait_ms_per_step"],
            ),
        )
        for r in others
    ]
    lost_ms = statistics.median(lost)
    step_ms = statistics.median(r["window_ms_per_step"] for r in measured)
    share = 100.0 * lost_ms / step_ms
    if share < STRAGGLER_MIN_PCT:
        return None
    compute_others = statistics.median(r["compute_ms_per_step"] for r in others)
    return finding(
        "straggler",
        "warning",
        f"rank {slowest['rank']} is a straggler: it computes {slowest['compute_ms_per_step']:.1f} ms per step "
        f"against the others' {compute_others:.1f}, and they wait for it {lost_ms:.1f} ms per step with their GPU "
        f"exposed (NCCL alone or idle; {share:.0f}% of a {step_ms:.1f} ms step): a slower or shared GPU, a busier "
        "host, or more work in its micro-batches (uneven sequence lengths)",
        rank=slowest["rank"],
        wait_ms_per_step=lost_ms,
        step_ms=step_ms,
        share_pct=share,
        compute_ms_per_step={r["rank"]: r["compute_ms_per_step"] for r in measured},
        exposed_wait_ms_per_step={r["rank"]: r["exposed_wait_ms_per_step"] for r in measured},
    )


def rank_findings(rows: list[dict]) -> list[Finding]:
    out = [f for f in [straggler(rows)] if f is not None]
    exposed = [r["exposed_nccl_pct"] for r in rows if r["exposed_nccl_pct"] is not None]
    if exposed and statistics.fmean(exposed) >= EXPOSED_COMM_MIN_PCT:
        worst = max(rows, key=lambda r: r["exposed_nccl_pct"] or 0.0)
        out.append(
            finding(
                "exposed_communication",
                "warning",
                f"communication is exposed: NCCL kernels run with no compute beside them for "
                f"{statistics.fmean(exposed):.1f}% of the steady state on average (rank {worst['rank']}: "
                f"{worst['exposed_nccl_pct']:.1f}%); the GPUs wait for gradients or parameters (larger "
                "buckets or micro-batches, FSDP prefetch, or a faster link)",
                exposed_nccl_pct=statistics.fmean(exposed),
                worst_rank=worst["rank"],
            )
        )
    return out


def ranks_summary(rows: list[dict]) -> str:
    parts = [
        f"rank {r['rank']}: busy {r['gpu_busy_pct']:.1f}%, NCCL {r['nccl_time_pct']:.1f}% of kernel time, "
        f"exposed {r['exposed_nccl_pct']:.1f}%"
        for r in rows
        if r["gpu_busy_pct"] is not None
    ]
    return f"{len(rows)} ranks profiled; " + "; ".join(parts)


def table(rows: list[dict]) -> str:
    """The per-rank table of the profile report (markdown)."""
    lines = [
        "| rank | GPU busy % | GPU idle % | NCCL % of kernel time | exposed NCCL % | step ms | NCCL ms/step "
        "| compute ms/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            r[k]
            for k in (
                "gpu_busy_pct",
                "gpu_idle_pct",
                "nccl_time_pct",
                "exposed_nccl_pct",
                "step_ms",
                "nccl_ms_per_step",
                "compute_ms_per_step",
            )
        ]
        lines.append(f"| {r['rank']} | " + " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"
