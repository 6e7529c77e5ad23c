"""The sweep's comparison: which combination won, by how much, at what memory cost, and why.

Built from the runs as MLflow holds them (ghsweep.report.sweep_source); written as markdown and as
one self-contained HTML file (plots embedded), plus the plots as PNGs. A metric a run lacks (no
profile, an older backend) shows as "-".
"""

from __future__ import annotations

import logging
import textwrap
from dataclasses import dataclass
from pathlib import Path

from ghsweep.core import stats
from ghsweep.core.errors import BaselineError
from ghsweep.core.run_dir import COMPARISON_DIR, COMPARISON_STEM
from ghsweep.profile import delta, scaling
from ghsweep.report import comparison_plots
from ghsweep.report.document import Document
from ghsweep.report.mlflow_ui import how_to_open, sweep_note
from ghsweep.report.sweep_source import SweepRun, load_sweep
from ghsweep.report.sweep_table import TERMINAL_COLUMNS, align, bounded, fmt_value, knob_columns
from ghsweep.tracking import records
from ghsweep.tracking.mlflow_store import MlflowStore, StoredRun

log = logging.getLogger(__name__)

PLOTS_DIR = "plots"
# (metric, column header, format); speedup is computed and sits after tokens/s.
METRIC_COLUMNS = (
    ("step_time_ms", "step ms", ".1f"),
    ("tokens_per_s", "tokens/s", ",.0f"),
    ("tflops_per_gpu", "TFLOP/s", ".3g"),
    ("mfu", "MFU", ".3g"),
    ("tokens_per_joule", "tokens/J", ".3g"),
    ("peak_mem_gb", "peak GiB", ".2f"),
    ("gpu_idle_pct", "GPU idle %", ".1f"),
)
# Overrides that set a combination's world: without them, a multi-GPU run names its 1-GPU twin.
WORLD_KEYS = ("backend.num_nodes=", "backend.gpus_per_node=")
# The all-gather an FSDP2 run on several ranks used, backend.fsdp_all_gather's auto resolved (torch_train's info).
FSDP_ALL_GATHER_TAG = "ghsweep.fsdp_all_gather"
# The knob whose values repeat a combination (report: the spread between repeats).
# Runs differing only in these are repeats of one combination: `repeat` (same data order) or `seed`
# (another data order too).
REPEAT_KNOBS = ("repeat", "seed")
# Peak memories closer than this (GiB, or this share of the larger) are the same: allocator rounding
# and a CPU's resident set move by a few MiB between identical runs.
MEMORY_RESOLUTION_GIB = 1 / 16
MEMORY_RESOLUTION_SHARE = 0.02
# Most severe first; a severity not listed ranks after these.
SEVERITY_ORDER = ("critical", "error", "high", "warning", "medium", "info", "low")


@dataclass
class Comparison:
    title: str
    runs: list[SweepRun]
    knobs: list[str]
    baseline: int | None  # index into runs; None when no run finished
    speedups: list[float | None]
    # Each speedup's 95% interval (ghsweep.core.stats.ratio); unknown bounds where a run has none.
    speedup_intervals: list[stats.Interval | None]
    pareto: set[int]
    # Tokens/s per GPU over the same combination's on one GPU, for runs on several GPUs.
    scaling: list[float | None]

    def number(self, i: int) -> int:
        """The run's job number in its sweep (its position where a job number is missing)."""
        job_num = self.runs[i].job_num
        return job_num if job_num is not None else i

    def label(self, i: int) -> str:
        run = self.runs[i]
        values = [run.shown_knobs.get(k, "-") for k in self.knobs]
        return f"#{self.number(i)} " + (" ".join(values) if values else bounded(run.name))

    @property
    def fastest(self) -> int | None:
        ranked = {i: s for i, s in enumerate(self.speedups) if s is not None}
        return max(ranked, key=ranked.__getitem__) if ranked else None

    def tied_with(self, i: int) -> list[int]:
        """The other finished runs whose tokens/s is not measurably different from run i's."""
        return [j for j in range(len(self.runs)) if j != i and same_throughput(self.runs[i], self.runs[j])]

    @property
    def fastest_tied(self) -> list[int]:
        """The fastest run and every run tied with it within noise, fastest first."""
        best = self.fastest
        if best is None:
            return []
        return [best, *sorted(self.tied_with(best), key=lambda j: -(self.speedups[j] or 0))]


def choose_baseline(runs: list[SweepRun], spec: int | str | None) -> int | None:
    """Index of the baseline: a job number, the overrides of one combination, or (None) the first finished."""
    if spec is None or spec == "":
        return next((i for i, r in enumerate(runs) if r.finished), None)
    text = str(spec).strip()
    if text.isdigit():
        match = [i for i, r in enumerate(runs) if r.job_num == int(text)]
    else:
        wanted = dict(o.partition("=")[::2] for o in text.split())
        match = [i for i, r in enumerate(runs) if wanted.items() <= r.knobs.items()]
    if not match:
        example = " ".join(o for o in runs[0].overrides if not o.startswith("report.")) if runs else "precision=bf16"
        numbers = ", ".join(str(r.job_num) for r in runs if r.job_num is not None) or "none recorded"
        raise BaselineError(
            f"report.baseline={spec}: matches no combination of this sweep; accepted: a job number "
            f"({numbers}) or the overrides of one combination, e.g. '{example}'"
        )
    return match[0]


def busy(run: SweepRun, base: SweepRun) -> str | None:
    """Why the two runs' speeds tell the machine's load apart rather than their knobs: one or both
    measured on a busy machine (its reason; the per-run interval cannot see the load change)."""
    pair = [base] if run is base else [base, run]
    return "; ".join(f"#{r.job_num}: {r.contended}" for r in pair if r.contended) or None


def speedup(run: SweepRun, base: SweepRun) -> stats.Interval | None:
    """Throughput relative to the baseline with its 95% interval (tokens/s; step time where tokens/s
    is missing); None where the two were not both measured on a quiet machine."""
    if not (run.finished and base.finished) or busy(run, base):
        return None
    t, bt = stats.from_metrics(run.metrics, "tokens_per_s"), stats.from_metrics(base.metrics, "tokens_per_s")
    if t and bt and t.estimate and bt.estimate:
        return stats.ratio(t, bt)
    s, bs = stats.from_metrics(run.metrics, "step_time_ms"), stats.from_metrics(base.metrics, "step_time_ms")
    return stats.ratio(bs, s) if s and bs and s.estimate and bs.estimate else None


def same_throughput(a: SweepRun, b: SweepRun) -> bool:
    """Both finished and the interval of their tokens/s ratio includes 1 (no measurable difference)."""
    r = speedup(a, b)
    return r is not None and r.contains(1.0)


def same_memory(a: float, b: float) -> bool:
    return abs(a - b) <= max(MEMORY_RESOLUTION_GIB, MEMORY_RESOLUTION_SHARE * max(a, b))


def speedup_text(r: stats.Interval | None) -> str:
    """`1.32x [1.30, 1.34]`; one whose interval includes 1: `=1 (±2.1%)`; no interval: `1.01x ±?`."""
    if r is None:
        return "-"
    if not r.known:
        return f"{r.estimate:.2f}x ±?"
    if r.contains(1.0):
        return f"=1 (±{max(r.high - 1, 1 - r.low) * 100:.1f}%)"
    return f"{r.estimate:.2f}x [{r.low:.2f}, {r.high:.2f}]"


def difference_text(r: stats.Interval) -> str:
    """A speedup in words: the measured difference with its interval, or that there is none."""
    if not r.known:
        return f"{r.estimate:.2f}x (no interval: too few steady steps to tell it from noise)"
    if r.contains(1.0):
        return f"no measurable difference (within ±{max(r.high - 1, 1 - r.low) * 100:.1f}%)"
    return f"{r.estimate:.2f}x (95% interval {r.low:.2f}-{r.high:.2f}x)"


def same_training_text(c: Comparison, i: int) -> str:
    """Said of a run whose knobs differ from the baseline's only where neither applied them: the
    two trained the same way, so whatever separates them is run-to-run variation, not a knob."""
    run, base = c.runs[i], c.runs[c.baseline] if c.baseline is not None else None
    if base is None or run.knobs == base.knobs or run.knobs_in_effect != base.knobs_in_effect:
        return ""
    knobs = sorted(k for k in run.knobs if run.knobs[k] != base.knobs.get(k))
    return (
        f"; the two trained the same way here ({', '.join(knobs)} had no effect), so this is run-to-run "
        "variation, not the knob"
    )


def scaling_efficiency(runs: list[tuple[list[str], dict | None]]) -> list[float | None]:
    """For each (overrides, metrics of a finished run or None): its tokens/s per GPU over the
    tokens/s of the same combination (the overrides without the world keys) on one GPU in the same
    list; None for one-GPU runs and where there is no finished one-GPU twin."""

    def combination(overrides: list[str]) -> tuple[str, ...]:
        return tuple(sorted(o for o in overrides if not o.startswith(WORLD_KEYS)))

    single = {
        combination(o): m["tokens_per_s"]
        for o, m in runs
        if m and m.get("tokens_per_s") and (m.get("world_size") or 1) == 1
    }
    out = []
    for overrides, m in runs:
        world = (m or {}).get("world_size") or 1
        base = single.get(combination(overrides))
        out.append(m["tokens_per_s"] / world / base if m and world > 1 and base and m.get("tokens_per_s") else None)
    return out


def pareto_front(runs: list[SweepRun]) -> set[int]:
    """The finished runs no other run beats beyond noise: at least as fast and at most as much memory
    (within noise), and measurably faster or using measurably less memory."""
    points = [
        i for i, r in enumerate(runs) if r.finished and "tokens_per_s" in r.metrics and "peak_mem_gb" in r.metrics
    ]

    def beats(j: int, i: int) -> bool:
        a, b = runs[j], runs[i]
        ma, mb = a.metrics["peak_mem_gb"], b.metrics["peak_mem_gb"]
        same_t, same_m = same_throughput(a, b), same_memory(ma, mb)
        # Speeds measured under different load are not compared: neither beats the other on them.
        faster = not same_t and not busy(a, b) and a.metrics["tokens_per_s"] > b.metrics["tokens_per_s"]
        smaller = not same_m and ma < mb
        return (faster or same_t) and (smaller or same_m) and (faster or smaller)

    return {i for i in points if not any(beats(j, i) for j in points if j != i)}


def top_finding(run: SweepRun) -> str | None:
    """The run's most severe finding; one not established (its figure's interval holds its threshold,
    profile.findings) is never it, so repeats of one configuration show the same top finding."""
    findings = [f for f in run.analysis.findings if f.evidence.get("established", True)] if run.analysis else []
    if not findings:
        return None
    rank = {s: n for n, s in enumerate(SEVERITY_ORDER)}
    worst = min(findings, key=lambda f: rank.get(f.severity.lower(), len(rank)))
    return worst.message


def configured_baseline(runs: list[SweepRun]) -> str | None:
    """The sweep's report.baseline as its runs logged it (a param; "None" when unset)."""
    value = next((r.params["report.baseline"] for r in runs if "report.baseline" in r.params), "None")
    return None if value == "None" else value


def build(title: str, runs: list[SweepRun], baseline: int | str | None = None) -> Comparison:
    """The comparison of `runs`; baseline None: the sweep's configured report.baseline, else the first finished."""
    base = choose_baseline(runs, baseline if baseline is not None else configured_baseline(runs))
    intervals = [speedup(r, runs[base]) if base is not None else None for r in runs]
    speedups = [i.estimate if i else None for i in intervals]
    scaling = scaling_efficiency([(r.overrides, r.metrics if r.finished else None) for r in runs])
    add_scale_out_findings(runs)
    return Comparison(
        title, runs, knob_columns([r.overrides for r in runs]), base, speedups, intervals, pareto_front(runs), scaling
    )


def add_scale_out_findings(runs: list[SweepRun]) -> None:
    """Each profiled run on several GPUs whose combination also ran on one GPU gets the scale-out
    finding (profile/scaling.py) among its analysis' findings, after the profiler's own: the sweep is
    the first place both runs are known."""
    finished = [(r.overrides, r.analysis if r.finished else None) for r in runs]
    for combination, (one, many), d in scaling.indexed_pairs(finished, WORLD_KEYS):
        analysis = runs[many].analysis
        assert analysis is not None  # indexed_pairs pairs profiled runs only
        # The all-gather the run used, auto resolved (its tag), is a knob already set like one on the command line.
        resolved = runs[many].tags.get(FSDP_ALL_GATHER_TAG)
        knobs = runs[many].knobs | ({"backend.fsdp_all_gather": resolved} if resolved else {})
        found = scaling.scale_out_finding(d, combination, knobs, runs[one].metrics.get("peak_mem_gb"))
        first = [f for f in analysis.findings if f.id in ("profiler_overhead", "sweep_overlap")]
        rest = [f for f in analysis.findings if f not in first and f.id != "scale_out"]
        analysis.findings = [*first, found, *rest]


def scale_out_lines(c: Comparison) -> list[str]:
    """The terminal summary's line for each run with a scale-out finding."""
    return [
        f"Scale-out {c.label(i)}: {f.message}."
        for i, r in enumerate(c.runs)
        for f in (r.analysis.findings if r.analysis else [])
        if f.id == "scale_out"
    ]


def table(c: Comparison) -> tuple[list[str], list[list[str]]]:
    """Header and rows shared by the markdown and HTML renderings."""
    # Only a sweep with multi-GPU runs gets the world's columns.
    multi_gpu = any((r.metrics.get("world_size") or 1) > 1 for r in c.runs)
    world_header = ["GPUs", "tokens/s/GPU", "scaling eff"] if multi_gpu else []
    header = [
        "#",
        *c.knobs,
        "status",
        *(h for _, h, _ in METRIC_COLUMNS[:2]),
        "speedup",
        *world_header,
        *(h for _, h, _ in METRIC_COLUMNS[2:]),
        "Pareto",
        "top finding / error",
    ]
    rows = []
    for i, r in enumerate(c.runs):
        metrics = [fmt_value(r.metrics.get(name), spec) for name, _, spec in METRIC_COLUMNS]
        metrics[1] = throughput_text(r.metrics) if r.metrics.get("tokens_per_s") is not None else metrics[1]
        mark = "baseline" if i == c.baseline else speedup_text(c.speedup_intervals[i])
        # The baseline row stays "baseline": a busy baseline marks every row compared with it.
        if c.baseline is not None and i != c.baseline and r.finished and busy(r, c.runs[c.baseline]):
            mark = "busy machine"
        world = (
            [
                fmt_value(r.metrics.get("world_size"), ".0f"),
                fmt_value(r.metrics.get("tokens_per_s_per_gpu"), ",.0f"),
                fmt_value(c.scaling[i], ".2f"),
            ]
            if multi_gpu
            else []
        )
        note = r.failure if not r.finished else top_finding(r)
        rows.append(
            [
                str(c.number(i)),
                *(r.shown_knobs.get(k, "-") for k in c.knobs),
                r.status,
                *metrics[:2],
                mark,
                *world,
                *metrics[2:],
                pareto_mark(c, i),
                note or "-",
            ]
        )
    return header, rows


def terminal_table(c: Comparison) -> tuple[list[str], list[list[str]]]:
    """The table without the columns no run has a value in (a CPU sweep's MFU, tokens/J, GPU idle %):
    the one table at the end of a sweep."""
    header, rows = table(c)
    keep = [i for i in range(len(header)) if i == len(header) - 1 or any(row[i] not in ("-", "") for row in rows)]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in rows]


def repeat_groups(c: Comparison) -> list[list[int]]:
    """Finished runs that differ only in `repeat` or `seed` (each repeat its own worker, with a fresh
    compile and allocator), in groups of two or more."""
    if not set(REPEAT_KNOBS) & set(c.knobs):
        return []
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(c.runs):
        if r.finished and r.metrics.get("tokens_per_s"):
            identity = tuple((k, v) for k, v in sorted(r.knobs.items()) if k not in REPEAT_KNOBS)
            groups.setdefault(identity, []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def repeats_text(c: Comparison, group: list[int]) -> str:
    """A combination's repeats: the spread between them, the widest interval within one, the combined interval."""
    within = [stats.from_metrics(c.runs[i].metrics, "tokens_per_s") for i in group]
    estimates = [i.estimate for i in within if i]
    combined = stats.combine_repeats(estimates, [i for i in within if i])
    widest = max((i.half_width_pct for i in within if i and i.known), default=float("nan"))
    return (
        f"Repeats {', '.join(f'#{c.number(i)}' for i in group)}: tokens/s {min(estimates):,.0f}-{max(estimates):,.0f}, "
        f"{stats.spread_pct(estimates):.2f}% apart between repeats, ±{widest:.2f}% within the widest; "
        f"together {combined.estimate:,.0f} ±{combined.half_width_pct:.2f}%."
    )


def throughput_text(metrics: dict) -> str:
    """tokens/s with its interval's half-width: `17,571 ±0.4%`."""
    i = stats.from_metrics(metrics, "tokens_per_s")
    assert i is not None
    return f"{i.estimate:,.0f} ±{i.half_width_pct:.1f}%" if i.known else f"{i.estimate:,.0f} ±?"


def pareto_mark(c: Comparison, i: int) -> str:
    """`yes`, or `yes (tie: #2)` where another run on the front matches it within noise on both axes."""
    if i not in c.pareto:
        return ""
    mem = c.runs[i].metrics["peak_mem_gb"]
    ties = [j for j in sorted(c.pareto) if j in c.tied_with(i) and same_memory(mem, c.runs[j].metrics["peak_mem_gb"])]
    return "yes" + (f" (tie: {', '.join(f'#{c.number(j)}' for j in ties)})" if ties else "")


def verdict(c: Comparison) -> list[str]:
    """The answer in sentences: the winner, its speedup and memory cost, the front, the failures."""
    finished = [i for i, r in enumerate(c.runs) if r.finished]
    lines = [f"{len(finished)} of {len(c.runs)} combinations finished."]
    if c.baseline is None:
        return lines + ["No combination finished, so there is nothing to compare."]
    base = c.runs[c.baseline]
    lines.append(f"Baseline: {c.label(c.baseline)} ({base.metrics.get('tokens_per_s', float('nan')):,.0f} tokens/s).")
    best = c.fastest
    tied = c.fastest_tied
    if best is not None and best != c.baseline and c.baseline not in tied:
        mem, base_mem = c.runs[best].metrics.get("peak_mem_gb"), base.metrics.get("peak_mem_gb")
        cost = f", at {mem / base_mem:.2f}x the baseline's peak memory" if mem and base_mem else ""
        others = f" (tied within noise: {', '.join(c.label(j) for j in tied[1:])})" if len(tied) > 1 else ""
        interval = c.speedup_intervals[best]
        assert interval is not None  # the fastest run has a speedup
        lines.append(f"Fastest: {c.label(best)}{others}: {difference_text(interval)} against the baseline{cost}.")
        d = step_delta(c, best)
        if d and delta.because(d):
            lines.append(f"Because, per step: {delta.because(d)}.")
        finding = top_finding(c.runs[best])
        if finding:
            lines.append(f"Its top finding: {finding}")
    elif busy_runs := [c.label(i) for i, r in enumerate(c.runs) if r.finished and r.contended]:
        # The baseline leads the runs compared; one measured under load might be faster, or be the baseline.
        lines.append(
            f"Fastest: not named: {', '.join(busy_runs)} measured on a busy machine (MLflow tag "
            "ghsweep.contended says why); run the sweep again on a quiet machine."
        )
    elif best is not None:
        rivals = [c.label(j) for j in tied if j != c.baseline]
        lines.append(
            "Fastest: the baseline"
            + (f", tied within noise with {', '.join(rivals)}." if rivals else "; no other combination beat it.")
        )
    for i, interval in enumerate(c.speedup_intervals):
        reason = busy(c.runs[i], base) if c.runs[i].finished else None
        if i != c.baseline and reason:
            lines.append(f"{c.label(i)} against the baseline: not compared, measured under different load ({reason}).")
        elif i != c.baseline and interval is not None:
            lines.append(f"{c.label(i)} against the baseline: {difference_text(interval)}{same_training_text(c, i)}.")
    lines += [repeats_text(c, group) for group in repeat_groups(c)]
    lines += scale_out_lines(c)
    if c.pareto:
        lines.append(
            "Pareto front (no other run has measurably more tokens/s at no more peak memory, or measurably "
            "less memory at no fewer tokens/s): " + ", ".join(c.label(i) for i in sorted(c.pareto)) + "."
        )
    for i, r in enumerate(c.runs):
        if not r.finished:
            lines.append(f"{c.label(i)} {r.status}: {r.failure}")
        if r.retried:
            lines.append(f"{c.label(i)} ran {len(r.retried) + 1} times; earlier attempts: {'; '.join(r.retried)}")
    return lines


def draw_plots(c: Comparison, out_dir: Path) -> dict[str, Path]:
    labels = [c.label(i) for i in range(len(c.runs))]
    drawn = {
        "Speedup": comparison_plots.speedup_bars(labels, c.speedup_intervals, c.baseline, out_dir / "speedup.png")
        if c.baseline is not None
        else None,
        "Throughput vs peak memory": comparison_plots.throughput_vs_memory(
            labels,
            [stats.from_metrics(r.metrics, "tokens_per_s") if r.finished else None for r in c.runs],
            [r.metrics.get("peak_mem_gb") if r.finished else None for r in c.runs],
            c.pareto,
            out_dir / "throughput_vs_memory.png",
        ),
        "Kernel-time shares": comparison_plots.kernel_shares(
            labels, [r.analysis.top_kernels if r.analysis else None for r in c.runs], out_dir / "kernel_shares.png"
        ),
        "Loss curves": comparison_plots.loss_curves(labels, [r.loss for r in c.runs], out_dir / "loss_curves.png"),
    }
    return {title: path for title, path in drawn.items() if path is not None}


MISSING_PLOT_NOTES = {
    "Speedup": "no combination finished.",
    "Throughput vs peak memory": "no finished run has both tokens_per_s and peak_mem_gb.",
    "Kernel-time shares": "no run has a profile analysis with top kernels (run the sweep with a profile option).",
    "Loss curves": "no run logged a loss.",
}


def step_delta(c: Comparison, i: int) -> dict | None:
    """Where run i's step time went against the baseline's (profile/delta.py); None for the baseline
    itself and where either run has no profile analysis with time per step."""
    if c.baseline is None or i == c.baseline or not c.runs[i].finished:
        return None
    base, run = c.runs[c.baseline].analysis, c.runs[i].analysis
    if base is None or run is None or not (delta.has_time_per_step(base) and delta.has_time_per_step(run)):
        return None
    return delta.step_delta(base, run)


def kernel_diff_section(c: Comparison, doc: Document) -> None:
    """Each profiled run against the profiled baseline: where its step time went, by part and by
    kernel family, and the kernels whose time per step changed most (the same code as `python -m
    ghsweep.analyze RUN --against BASELINE`)."""
    for i in range(len(c.runs)):
        d = step_delta(c, i)
        if d is None:
            continue
        doc.heading(f"Kernels: {c.label(i)} against the baseline")
        doc.paragraph(
            f"Its speedup: {speedup_text(c.speedup_intervals[i])}. {delta.headline(d)}"
            + (f"; because, per step: {delta.because(d)}." if delta.because(d) else ".")
        )
        doc.table(*delta.parts_table(d))
        doc.table(*delta.family_table(d))
        doc.table(*delta.kernel_table(d))


def document(c: Comparison, drawn: dict[str, Path]) -> Document:
    doc = Document(f"Comparison: {c.title}")
    for line in verdict(c):
        doc.paragraph(line)
    doc.table(*table(c))
    doc.paragraph(
        "Speedup: tokens/s relative to the baseline with its 95% interval; `=1 (±x%)`: no measurable "
        "difference, the interval includes 1; `busy machine`: it or the baseline was measured while other "
        "processes took the host's CPU or its GPU, or the GPU's clocks were slowed (MLflow tag "
        "ghsweep.contended), so their speeds are not compared. tokens/s ±: half-width of its 95% interval over "
        'the steady steps. "-": the run did not record that metric.'
    )
    for title, note in MISSING_PLOT_NOTES.items():
        doc.heading(title)
        if title in drawn:
            doc.image(title, drawn[title])
        else:
            doc.paragraph(f"No plot: {note}")
    kernel_diff_section(c, doc)
    scaling_section(c, doc)
    return doc


def scaling_section(c: Comparison, doc: Document) -> None:
    """For each combination run on 1 and on N GPUs, both profiled: where the per-GPU throughput
    went, in ms per step (profile/scaling.py), with the kernels that changed most."""
    for combination, d in scaling.pairs(((r.overrides, r.analysis) for r in c.runs if r.finished), WORLD_KEYS):
        doc.heading(f"Scaling: {combination}")
        doc.paragraph(scaling.headline(d))
        doc.table(*scaling.table(d))
        doc.table(*scaling.kernel_table(d))


def write_report(c: Comparison, out_dir: Path) -> list[Path]:
    """Write comparison.md, comparison.html and plots/*.png under out_dir; return the files written."""
    drawn = draw_plots(c, out_dir / PLOTS_DIR)
    return [*document(c, drawn).write(out_dir, COMPARISON_STEM), *drawn.values()]


def compare_sweep(
    store: MlflowStore, parent: StoredRun, out_dir: Path, baseline: int | str | None = None
) -> tuple[Comparison, list[Path]]:
    """Read the sweep under `parent` from MLflow, compare its runs and write the report."""
    c = build(parent.name, load_sweep(store, parent), baseline)
    return c, write_report(c, out_dir)


def report_comparison(store: MlflowStore, parent_run_id: str, out_dir: Path, run_ids: list[str]) -> bool:
    """Compare the sweep's runs (`run_ids` in job order, read back from MLflow), log the report to the
    parent, print its table and verdict within TERMINAL_COLUMNS; False where nothing was printed.

    A report that cannot be made is said and tagged, never raised: the parent run must still finish.
    """
    # Written first, so `python -m ghsweep.report` later compares the same runs, reused ones included.
    records.record_compared_runs(store, parent_run_id, run_ids)
    try:
        parent = store.get_run(parent_run_id)
        comparison, files = compare_sweep(store, parent, out_dir)
    except BaselineError as exc:
        print(f"ghsweep: no comparison report: {exc}", flush=True)
        records.record_report_error(store, parent_run_id, str(exc))
        return False
    except OSError as exc:  # a full or read-only sweep directory: said in one line, the summary stands
        log.error("ghsweep: no comparison report in %s: %s", out_dir, exc)
        records.record_report_error(store, parent_run_id, f"{type(exc).__name__}: {exc}")
        return False
    except Exception as exc:  # a bug or an MLflow outage in the report must not leave the parent RUNNING
        log.exception("ghsweep: the comparison report failed")
        records.record_report_error(store, parent_run_id, f"{type(exc).__name__}: {exc}")
        return False
    answer = verdict(comparison)
    baseline = comparison.label(comparison.baseline) if comparison.baseline is not None else None
    note = sweep_note(answer, parent.experiment_id, parent_run_id)
    records.record_comparison(store, parent_run_id, records.ComparisonReport(out_dir, files, baseline, note))
    wrapped = [
        textwrap.fill(line, TERMINAL_COLUMNS, initial_indent="  ", subsequent_indent="    ", break_long_words=False)
        for line in answer
    ]
    print(
        "ghsweep comparison:\n"
        + align(*terminal_table(comparison), width=TERMINAL_COLUMNS)
        + "\n"
        + "\n".join(wrapped)
        + f"\n  report: {out_dir / (COMPARISON_STEM + '.html')} "
        + f"(and on the sweep's MLflow run under {COMPARISON_DIR}/)"
        + "\n  MLflow: "
        + "\n    ".join(how_to_open(store.tracking_uri, parent.experiment_id, parent_run_id))
        + "\n",
        flush=True,
    )
    return True
