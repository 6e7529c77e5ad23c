"""The profile part of a run's report, in markdown: summary, findings, top kernels, roofline."""

from __future__ import annotations

from pathlib import Path

from ghsweep.core.run_dir import PROFILE_REPORT, TOP_KERNELS_TABLE
from ghsweep.profile.ranks import table as ranks_table
from ghsweep.profile.result import METRICS, ProfileAnalysis


def top_kernels_table(analysis: ProfileAnalysis) -> str:
    lines = ["| # | kernel | total ms | count | mean us | % of kernel time |", "|---|---|---|---|---|---|"]
    for i, k in enumerate(analysis.top_kernels, 1):
        lines.append(
            f"| {i} | `{k['name'][:90]}` | {k['total_ns'] / 1e6:.2f} | {k['count']} | "
            f"{k['mean_ns'] / 1e3:.1f} | {k['pct']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def longest_gaps(top: dict[str, list[dict]]) -> list[str]:
    """The longest idle gaps of each cause with their times on the trace's clock (ns), so every
    idle number above can be found on the timeline."""
    if not top:
        return []
    lines = [
        "",
        "Longest idle gaps by cause (trace time, ns):",
        "",
        "| cause | start | end | ms |",
        "|---|---|---|---|",
    ]
    for cause, gaps in top.items():
        lines += [f"| {cause.replace('_', ' ')} | {g['start_ns']} | {g['end_ns']} | {g['ms']:.3f} |" for g in gaps]
    return lines


def render(analysis: ProfileAnalysis) -> str:
    w = analysis.window
    steps = f", steps {w.get('steps')}" if w.get("steps") else ""
    lines = [
        f"# Profile analysis ({analysis.source['kind']})",
        "",
        f"Window: {w.get('basis')}{steps}, {w.get('duration_ns', 0) / 1e6:.1f} ms"
        + (f"; warm-up excluded: {w['warmup_steps']}" if w.get("warmup_steps") else ""),
        "",
    ]
    lines += [f"- {s}" for s in analysis.summary]
    if analysis.profiler_overhead_pct is not None:
        lines.append(
            f"- profiled step {analysis.profiled_step_ms:.2f} ms against {analysis.measured_step_ms:.2f} ms measured "
            f"untraced: profiler overhead {analysis.profiler_overhead_pct:+.1f}%"
        )
    lines += ["", "## Findings", ""]
    lines += [f"- **{f.severity}** `{f.id}`: {f.message}" for f in analysis.findings] or ["- none"]
    lines += ["", "## Where the time went", ""]
    measured = {key: getattr(analysis, key) for key in METRICS if getattr(analysis, key) is not None}
    if measured:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {key} | {value:.3g} |" for key, value in measured.items()]
        # One GPU has no communication to show, a profile alone no measured steps to hold its own
        # against; any other metric the profile lacks is named once.
        missing = [
            key for key in METRICS if key not in measured and "nccl" not in key and key != "profiler_overhead_pct"
        ]
        if missing:
            lines += ["", f"Not in this profile: {', '.join(missing)}."]
    else:
        # A CPU run: the GPU-time metrics do not apply; the phases and top operators below are its profile.
        lines.append("No GPU activity in this profile, so the GPU-time metrics do not apply.")
    causes = analysis.gaps.get("causes_ns")
    if causes:
        lines += [
            "",
            "Idle time by cause (ms in the window): "
            + ", ".join(f"{k.replace('_', ' ')} {v / 1e6:.2f}" for k, v in causes.items()),
        ]
    phases = analysis.phases_ms_per_step
    if phases:
        lines += ["", "Phases per step (ms, host time): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())]
    lines += longest_gaps(analysis.gaps.get("top_gaps", {}))
    if analysis.ranks:
        lines += [
            "",
            "## Ranks",
            "",
            "Each rank's own steady window; the metrics above are means over the ranks "
            "(top kernels and idle causes: rank 0).",
            "",
            ranks_table(analysis.ranks),
        ]
    lines += ["", "## Top kernels", "", top_kernels_table(analysis)]
    roof = analysis.roofline
    if roof:
        lines += [
            "## Roofline (Nsight Compute)",
            "",
            "| kernel | TFLOP/s | % compute peak | % DRAM | FLOP/byte | bound |",
            "|---|---|---|---|---|---|",
        ]
        for p in roof["kernels"]:
            lines.append(
                f"| `{p['name'][:70]}` | {p['achieved_tflops']:.1f} | {p['pct_of_compute_peak']:.0f} | "
                f"{p['pct_of_dram_peak']:.0f} | {p['intensity_dram']:.1f} | {p['bound'].replace('_', ' ')} |"
            )
    return "\n".join(lines) + "\n"


def write(analysis: ProfileAnalysis, run_dir: Path) -> list[Path]:
    report = run_dir / PROFILE_REPORT
    report.write_text(render(analysis))
    table = run_dir / TOP_KERNELS_TABLE
    table.write_text(top_kernels_table(analysis))
    return [report, table]
