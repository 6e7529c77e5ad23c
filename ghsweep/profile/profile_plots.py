"""The two plots of a profiled run: the idle-gap histogram and the roofline of the top kernels."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # files only: runs on headless compute nodes
import matplotlib.pyplot as plt  # noqa: E402

if TYPE_CHECKING:
    from ghsweep.profile.result import ProfileAnalysis


def gap_histogram(analysis: ProfileAnalysis, path: Path) -> Path:
    hist = analysis.gaps.get("histogram", [])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [h["bucket"] for h in hist]
    bars = ax.bar(labels, [h["count"] for h in hist], color="#4c72b0")
    for bar, h in zip(bars, hist):
        ax.annotate(
            f"{h['total_ns'] / 1e6:.1f} ms",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xlabel("GPU idle gap length")
    ax.set_ylabel("gaps in the steady-state window")
    ax.set_title(f"GPU idle gaps (busy {analysis.gpu_busy_pct or 0:.1f}%; label: total idle time)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def roofline_plot(roofline: dict, path: Path) -> Path:
    points, peaks = roofline["kernels"], roofline["peaks"]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    compute = max([p["compute_peak_tflops"] * 1e12 for p in points] or [peaks.get("fp32_flops_per_s", 1.0)])
    xs = [10 ** (i / 10) for i in range(-20, 41)]
    for level, style in (("dram", "-"), ("l2", "--"), ("l1", ":")):
        bandwidth = peaks.get(f"{level}_bytes_per_s")
        if bandwidth:
            ax.plot(
                xs,
                [min(compute, x * bandwidth) / 1e12 for x in xs],
                style,
                color="grey",
                label=f"{level.upper()} {bandwidth / 1e12:.1f} TB/s",
            )
    for p in points:
        if p["intensity_dram"] > 0 and p["achieved_tflops"] > 0:
            ax.scatter(
                p["intensity_dram"],
                p["achieved_tflops"],
                s=30,
                zorder=3,
                label=f"{p['name'][:40]} ({p['bound'].replace('_', ' ')})",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Roofline of the top kernels (compute ceiling {compute / 1e12:.0f} TFLOP/s)", fontsize=9)
    ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
