"""The profiling assignment's report: a baseline run and an optimised run, side by side.

For each run the Top-5 kernels of one training iteration with their roofline points (when the
profile had a Nsight Compute pass), the optimisation's speedup of one iteration, and a profile
diff: which kernels appeared, disappeared, got faster or slower. Input: two runs as MLflow holds
them, each with its profile analysis (ghsweep.profile.result.ProfileAnalysis: `top_kernels` of
{name, total_ns, count, mean_ns, pct}, `window.steps`, and `roofline` {kernels: points, peaks}
after an ncu pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ghsweep.profile.result import ProfileAnalysis
from ghsweep.profile.roofline import same_function
from ghsweep.report import comparison_plots
from ghsweep.report.document import Document
from ghsweep.report.sweep_source import SweepRun
from ghsweep.report.sweep_table import fmt_value

REPORT_STEM = "assignment"
TOP_K = 5
# A common kernel whose time per iteration changed by less than this share counts as unchanged.
UNCHANGED_WITHIN = 0.05
# Params that differ between any two runs without being a change of setup.
NOT_SETUP = ("report.baseline",)
# Settings named in the one-line summary (the report lists them all).
SUMMARY_CHANGES = 3
CHANGE_KINDS = ("added", "removed", "entered top", "left top", "faster", "slower", "unchanged")


@dataclass(frozen=True)
class KernelChange:
    name: str
    baseline_ns: float | None  # per iteration; None: not among the baseline's listed kernels
    optimised_ns: float | None
    kind: str  # one of CHANGE_KINDS


def steps_in_window(analysis: ProfileAnalysis) -> int | None:
    """How many iterations the analysed kernel times cover; None when the analysis does not say."""
    steps = analysis.window.get("steps")
    count = len(steps) if isinstance(steps, list) else steps
    return count if isinstance(count, int) and count > 0 else None


def kernel_time_per_iteration(analysis: ProfileAnalysis | None) -> dict[str, float]:
    if not analysis:
        return {}
    steps = steps_in_window(analysis) or 1
    return {k["name"]: k["total_ns"] / steps for k in analysis.top_kernels}


def all_kernel_names(analysis: ProfileAnalysis | None) -> set[str] | None:
    """Every kernel name of the whole trace, when the analysis lists them all (None: it does not,
    e.g. only the first WHOLE_TRACE_KERNELS of a trace with more)."""
    whole = analysis.whole_trace if analysis else {}
    kernels = whole.get("kernels")
    if not kernels or len(kernels) < whole.get("distinct_kernels", len(kernels)):
        return None
    return {k["name"] for k in kernels}


def profile_diff(baseline: ProfileAnalysis | None, optimised: ProfileAnalysis | None) -> list[KernelChange]:
    """How the top kernels changed, per iteration.

    A kernel in only one run's top list is 'added' or 'removed' when the other run's whole trace is
    listed and lacks it, else it 'entered' or 'left' the top list (present in the other run, or not
    known to be absent); kernels in both lists are faster, slower or unchanged.
    """
    before, after = kernel_time_per_iteration(baseline), kernel_time_per_iteration(optimised)
    before_all, after_all = all_kernel_names(baseline), all_kernel_names(optimised)
    changes = []
    for name in [*before, *(n for n in after if n not in before)]:
        b, a = before.get(name), after.get(name)
        if b is None:
            kind = "added" if before_all is not None and name not in before_all else "entered top"
        elif a is None:
            kind = "removed" if after_all is not None and name not in after_all else "left top"
        elif abs(a - b) <= UNCHANGED_WITHIN * b:
            kind = "unchanged"
        else:
            kind = "faster" if a < b else "slower"
        changes.append(KernelChange(name, b, a, kind))
    return sorted(changes, key=lambda c: (CHANGE_KINDS.index(c.kind), -max(c.baseline_ns or 0, c.optimised_ns or 0)))


def iteration_speedup(baseline: SweepRun, optimised: SweepRun) -> float | None:
    """Baseline step time / optimised step time (median steady-state steps of each)."""
    b, o = baseline.metrics.get("step_time_ms"), optimised.metrics.get("step_time_ms")
    return b / o if b and o else None


def setup_changes(baseline: SweepRun, optimised: SweepRun) -> list[tuple[str, str, str]]:
    keys = sorted(set(baseline.params) | set(optimised.params))
    return [
        (k, baseline.params.get(k, "-"), optimised.params.get(k, "-"))
        for k in keys
        if k not in NOT_SETUP and baseline.params.get(k) != optimised.params.get(k)
    ]


def roofline(analysis: ProfileAnalysis | None) -> tuple[list[dict], dict]:
    """The analysis' roofline points and peaks; empty without an ncu pass."""
    found = analysis.roofline if analysis else {}
    return found.get("kernels") or [], found.get("peaks") or {}


def kernel_point(kernel: dict, points: list[dict]) -> dict:
    """The roofline point of a top kernel: Nsight Compute's name of the same kernel, else of the same
    function (the tools spell templates and namespaces differently; points come by time, largest first)."""
    same = [p for p in points if p["name"] == kernel["name"]]
    same = same or [p for p in points if same_function(kernel.get("short_name") or kernel["name"], p["name"])]
    return same[0] if same else {}


def top_kernel_rows(analysis: ProfileAnalysis) -> list[list[str]]:
    steps = steps_in_window(analysis) or 1
    points = roofline(analysis)[0]
    rows = []
    for i, k in enumerate(analysis.top_kernels[:TOP_K]):
        p = kernel_point(k, points)
        rows.append(
            [
                str(i + 1),
                comparison_plots.short_name(k["name"], 90),
                fmt_value(k["total_ns"] / steps / 1e6, ".3f"),
                fmt_value(k["count"] / steps, ".1f"),
                fmt_value(k["mean_ns"] / 1e3, ".1f"),
                fmt_value(k["pct"], ".1f"),
                fmt_value(p.get("intensity_dram"), ".3g"),
                fmt_value(p.get("achieved_tflops"), ".3g"),
                fmt_value(p.get("pct_of_compute_peak"), ".1f"),
                p.get("bound", "-").replace("_", " "),
            ]
        )
    return rows


TOP_HEADER = [
    "#",
    "kernel",
    "ms / iteration",
    "launches / iteration",
    "mean us",
    "% of kernel time",
    "FLOP / DRAM byte",
    "TFLOP/s",
    "% of compute peak",
    "bound",
]


def document(baseline: SweepRun, optimised: SweepRun, out_dir: Path) -> tuple[Document, list[Path]]:
    doc = Document("Profiling assignment: baseline vs optimised")
    doc.paragraph(
        f"Baseline: run {baseline.name} ({baseline.run_id}). Optimised: run {optimised.name} ({optimised.run_id})."
    )
    changes = setup_changes(baseline, optimised)
    doc.heading("What the optimisation changed")
    if changes:
        doc.table(["setting", "baseline", "optimised"], [list(c) for c in changes])
    else:
        doc.paragraph("The two runs have the same settings.")

    doc.heading("One training iteration")
    speedup = iteration_speedup(baseline, optimised)
    doc.paragraph(
        f"Speedup of one iteration: {fmt_value(speedup, '.2f')}x (baseline step time / optimised step "
        "time; median of the steady-state steps)."
    )
    rows = []
    for name, header, spec in (
        ("step_time_ms", "step time (ms)", ".2f"),
        ("tokens_per_s", "tokens/s", ",.0f"),
        ("tflops_per_gpu", "TFLOP/s", ".3g"),
        ("mfu", "MFU", ".3g"),
        ("peak_mem_gb", "peak memory (GiB)", ".2f"),
        ("gpu_idle_pct", "GPU idle %", ".1f"),
    ):
        rows.append([header, fmt_value(baseline.metrics.get(name), spec), fmt_value(optimised.metrics.get(name), spec)])
    doc.table(["", "baseline", "optimised"], rows)

    for label, run in (("baseline", baseline), ("optimised", optimised)):
        doc.heading(f"Top-{TOP_K} kernels: {label}")
        if run.analysis and run.analysis.top_kernels:
            doc.table(TOP_HEADER, top_kernel_rows(run.analysis))
            if steps_in_window(run.analysis) is None:
                doc.paragraph(
                    "This analysis does not say how many iterations it covers: the times per iteration "
                    "above are totals over its whole profiled window."
                )
            found = run.analysis.roofline
            if not roofline(run.analysis)[0]:
                doc.paragraph("No roofline points: this run's profile had no Nsight Compute pass.")
            elif found.get("missing"):
                doc.paragraph(f"Nsight Compute profiled none of: {', '.join(found['missing'])}.")
            if found.get("ncu_pass"):
                ncu = found["ncu_pass"]
                doc.paragraph(f"Nsight Compute pass: {ncu['seconds']:.0f} s, {ncu['launches']} of the top kernels.")
        else:
            doc.paragraph(f"No profile analysis in run {run.name}: run it with a profile option to get its kernels.")

    drawn = comparison_plots.roofline(
        {"baseline": roofline(baseline.analysis), "optimised": roofline(optimised.analysis)},
        out_dir / "plots" / "roofline.png",
    )
    if drawn:
        doc.heading("Roofline")
        doc.image("Roofline of the top kernels", drawn)

    doc.heading("Kernel mix: profile diff")
    diff = profile_diff(baseline.analysis, optimised.analysis)
    if diff:
        doc.paragraph(
            f"The top kernels of both runs, time per iteration. added / removed: absent from the other "
            f"run's whole profile; entered / left top: outside the other run's top list (present in its "
            f"profile, or its profile lists no more kernels); unchanged: within {UNCHANGED_WITHIN:.0%}."
        )
        doc.table(
            ["change", "kernel", "baseline ms", "optimised ms"],
            [
                [
                    c.kind,
                    comparison_plots.short_name(c.name, 90),
                    fmt_value(_ms(c.baseline_ns), ".3f"),
                    fmt_value(_ms(c.optimised_ns), ".3f"),
                ]
                for c in diff
            ],
        )
    else:
        doc.paragraph("No kernels to compare: neither run has a profile analysis.")

    for label, run in (("baseline", baseline), ("optimised", optimised)):
        findings = run.analysis.findings if run.analysis else []
        if findings:
            doc.heading(f"Findings: {label}")
            for f in findings:
                doc.paragraph(f"[{f.severity}] {f.message}")
    return doc, [drawn] if drawn else []


def _ms(ns: float | None) -> float | None:
    return ns / 1e6 if ns is not None else None


def write_assignment(baseline: SweepRun, optimised: SweepRun, out_dir: Path) -> list[Path]:
    """Write assignment.md, assignment.html and its plots under out_dir; return the files written."""
    doc, drawn = document(baseline, optimised, out_dir)
    return [*doc.write(out_dir, REPORT_STEM), *drawn]


def summary(baseline: SweepRun, optimised: SweepRun) -> str:
    diff = profile_diff(baseline.analysis, optimised.analysis)
    counts = ", ".join(f"{sum(c.kind == k for c in diff)} {k}" for k in CHANGE_KINDS)
    changed = ", ".join(f"{k} {b} -> {o}" for k, b, o in setup_changes(baseline, optimised)[:SUMMARY_CHANGES])
    return (
        f"speedup of one iteration: {fmt_value(iteration_speedup(baseline, optimised), '.2f')}x "
        f"({changed or 'same settings'}); kernels: {counts if diff else 'no profile analysis'}"
    )
