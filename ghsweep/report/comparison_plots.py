"""The comparison's figures, drawn on matplotlib Figures (no pyplot state, no display needed).

Each function writes one PNG and returns its path, or returns None when no run has the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ghsweep.core.stats import Interval

BASELINE_COLOR = "#7f7f7f"
RUN_COLOR = "#1f77b4"
PARETO_COLOR = "#d62728"
# Kernel-share segments beyond the palette share one colour; the legend still names them.
KERNEL_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
OTHER_COLOR = "#d9d9d9"
NAME_CHARS = 48


def short_name(name: str, limit: int = NAME_CHARS) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a link planted in its place is replaced, its target left alone
    # "tight" keeps legends placed outside the axes inside the image.
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def _error(intervals: Sequence[Interval]) -> list[list[float]]:
    """matplotlib's asymmetric error bars (below, above) of intervals; none where a bound is unknown."""
    return [
        [i.estimate - i.low if i.known else 0.0 for i in intervals],
        [i.high - i.estimate if i.known else 0.0 for i in intervals],
    ]


def speedup_bars(labels: Sequence[str], speedups: Sequence[Interval | None], baseline: int, path: Path) -> Path | None:
    """Bars from 0 with each speedup's 95% interval: a difference inside the bars' error reads as none."""
    shown = [(i, s) for i, s in enumerate(speedups) if s is not None]
    if not shown:
        return None
    fig = Figure(figsize=(max(5.0, 0.9 * len(shown) + 2), 3.8))
    ax = fig.add_subplot()
    bars = ax.bar(
        [labels[i] for i, _ in shown],
        [s.estimate for _, s in shown],
        yerr=_error([s for _, s in shown]),
        capsize=4,
        color=[BASELINE_COLOR if i == baseline else RUN_COLOR for i, _ in shown],
    )
    ax.bar_label(bars, labels=[f"{s.estimate:.2f}x" for _, s in shown], fontsize=8, label_type="center")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"tokens/s relative to {labels[baseline]}")
    ax.set_title("Speedup over the baseline (grey), 95% intervals")
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    return _save(fig, path)


def throughput_vs_memory(
    labels: Sequence[str],
    tokens_per_s: Sequence[Interval | None],
    peak_mem_gb: Sequence[float | None],
    pareto: set[int],
    path: Path,
) -> Path | None:
    """Both axes from 0, so a difference of a few MiB or a fraction of the noise does not fill the plot."""
    points = [(i, t, m) for i, (t, m) in enumerate(zip(tokens_per_s, peak_mem_gb)) if t is not None and m is not None]
    if not points:
        return None
    fig = Figure(figsize=(6.0, 4.2))
    ax = fig.add_subplot()
    for i, t, m in points:
        on_front = i in pareto
        color = PARETO_COLOR if on_front else RUN_COLOR
        ax.errorbar(
            m, t.estimate, yerr=_error([t]), fmt="o", markersize=8 if on_front else 5, color=color, capsize=3, zorder=3
        )
        ax.annotate(labels[i], (m, t.estimate), textcoords="offset points", xytext=(5, 4), fontsize=8)
    front = sorted((m, t.estimate) for i, t, m in points if i in pareto)
    if len(front) > 1:
        ax.plot(
            [m for m, _ in front],
            [t for _, t in front],
            color=PARETO_COLOR,
            linewidth=1,
            linestyle="--",
            label="Pareto front",
        )
        ax.legend(fontsize=8)
    ax.set_xlim(left=0, right=max(m for _, _, m in points) * 1.15)
    ax.set_ylim(bottom=0, top=max(t.high if t.known else t.estimate for _, t, _ in points) * 1.15)
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel("tokens/s (95% interval)")
    ax.set_title("Throughput vs peak memory (red: Pareto front)")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def kernel_shares(labels: Sequence[str], top_kernels: Sequence[Sequence[dict] | None], path: Path) -> Path | None:
    """Stacked bars: each run's top kernels as shares of its kernel time, the rest as 'other'."""
    rows = [(labels[i], kernels) for i, kernels in enumerate(top_kernels) if kernels]
    if not rows:
        return None
    names: list[str] = []
    for _, kernels in rows:
        names += [k["name"] for k in kernels if k["name"] not in names]
    color = {n: KERNEL_COLORS[i % len(KERNEL_COLORS)] for i, n in enumerate(names)}
    fig = Figure(figsize=(7.0, 1.5 + 0.5 * max(len(rows), 0.4 * len(names))))
    ax = fig.add_subplot()
    for y, (_label, kernels) in enumerate(rows):
        left = 0.0
        for k in kernels:
            ax.barh(y, k["pct"], left=left, color=color[k["name"]])
            left += k["pct"]
        ax.barh(y, max(0.0, 100.0 - left), left=left, color=OTHER_COLOR)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of kernel time (%)")
    ax.set_title("Kernel-time shares per run (top kernels; grey: all other kernels)")
    handles = [Patch(color=color[n]) for n in names] + [Patch(color=OTHER_COLOR)]
    ax.legend(
        handles,
        [short_name(n) for n in names] + ["other kernels"],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=7,
        frameon=False,
    )
    return _save(fig, path)


def loss_curves(labels: Sequence[str], histories: Sequence[Sequence[tuple[int, float]]], path: Path) -> Path | None:
    if not any(histories):
        return None
    fig = Figure(figsize=(6.5, 4.0))
    ax = fig.add_subplot()
    for label, history in zip(labels, histories):
        if history:
            ax.plot([s for s, _ in history], [v for _, v in history], label=label, linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("Loss curves")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def roofline(series: dict[str, tuple[Sequence[dict], dict]], path: Path) -> Path | None:
    """Roofline points of several runs on one log-log chart, with each run's ceilings when known.

    Per run: (points, peaks) as ghsweep.profile.roofline writes them: points of {"name",
    "intensity_dram" (FLOP/byte), "achieved_tflops", "compute_peak_tflops"}, peaks with
    "dram_bytes_per_s".
    """
    if not any(points for points, _ in series.values()):
        return None
    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.add_subplot()
    markers = "os^Dv"
    for n, (run_label, (points, peaks)) in enumerate(series.items()):
        shown = [p for p in points if p.get("intensity_dram") and p.get("achieved_tflops")]
        if not shown:
            continue
        ai = [p["intensity_dram"] for p in shown]
        ax.scatter(
            ai, [p["achieved_tflops"] for p in shown], marker=markers[n % len(markers)], label=run_label, zorder=3
        )
        compute_tflops = max((p.get("compute_peak_tflops") or 0 for p in shown), default=0)
        dram_tbps = (peaks.get("dram_bytes_per_s") or 0) / 1e12
        if compute_tflops and dram_tbps:
            ridge = compute_tflops / dram_tbps
            xs = [min(min(ai) / 4, ridge / 10), ridge, max(max(ai) * 4, ridge * 10)]
            ax.plot(
                xs,
                [min(compute_tflops, x * dram_tbps) for x in xs],
                linewidth=1,
                linestyle="--",
                label=f"{run_label}: ceiling",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("Roofline of the top kernels")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _save(fig, path)
