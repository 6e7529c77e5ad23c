"""What a profile analysis holds (profile_analysis.json, `python -m ghsweep.analyze --json`), for
every reader of it: findings, the profile report, ranks, the sweep comparison and the assignment.

Both readers (nsys, PyTorch traces) fill the same fields; what a source cannot tell stays at its
default (None for a number, empty for a block): a CPU run has no device metrics, a PyTorch trace
no page faults or NCCL communication. The definitions of the numbers: analysis.py.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ghsweep.core.errors import ProfileError
from ghsweep.core.run_dir import PROFILE_ANALYSIS


@dataclass(frozen=True)
class Finding:
    """One thing a rule (findings.py, ranks.py) found in an analysis, said in words, with the numbers behind it."""

    id: str  # the rule that fired: gpu_starved, host_sync, straggler, profile_health, ...
    severity: str  # warning | info
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


# The analysis' numbers logged as MLflow metrics and shown in the profile report, in this order
# (one vocabulary for every backend and profiler).
METRICS = (
    "gpu_busy_pct",
    "gpu_idle_pct",
    "idle_gaps_per_step",
    "kernel_time_pct",
    "memcpy_time_pct",
    "memset_time_pct",
    "exposed_memcpy_pct",
    "um_migration_pct",
    "h2d_gb",
    "d2h_gb",
    "nccl_time_pct",
    "exposed_nccl_pct",
    "profiler_overhead_pct",
)


@dataclass
class ProfileAnalysis:
    source: dict[str, Any] = field(default_factory=dict)  # path, kind (nsys | torch), device, GPU name, ...
    window: dict[str, Any] = field(default_factory=dict)  # start/end/duration ns, basis, steps, warm-up
    # The metrics of METRICS (None: not measured, e.g. a CPU run, or NCCL on one GPU).
    gpu_busy_pct: float | None = None
    gpu_idle_pct: float | None = None
    idle_gaps_per_step: float | None = None
    kernel_time_pct: float | None = None
    memcpy_time_pct: float | None = None
    memset_time_pct: float | None = None
    exposed_memcpy_pct: float | None = None
    um_migration_pct: float | None = None
    h2d_gb: float | None = None
    d2h_gb: float | None = None
    nccl_time_pct: float | None = None
    exposed_nccl_pct: float | None = None
    um_migration_bytes_pct: float | None = None  # nsys only
    top_kernels: list[dict[str, Any]] = field(default_factory=list)  # (CPU run: top operators by self time)
    whole_trace: dict[str, Any] = field(default_factory=dict)  # totals over the whole trace (the cross-check)
    kernels: dict[str, Any] = field(default_factory=dict)  # count, total_ns, short_pct, launch_api_ns, GEMM time
    memcpy: dict[str, Any] = field(default_factory=dict)  # count, total_ns, bytes, copies, by_kind, pageable_big
    memset: dict[str, Any] = field(default_factory=dict)
    page_faults: dict[str, int] = field(default_factory=dict)  # nsys only
    gaps: dict[str, Any] = field(default_factory=dict)  # histogram, idle gap statistics, causes_ns
    communication: dict[str, Any] = field(default_factory=dict)  # NCCL kernels (nsys, several GPUs)
    phases_ms_per_step: dict[str, float] = field(default_factory=dict)
    step_ms: dict[str, Any] = field(default_factory=dict)  # median, first, all
    # A mean steady step in ms: compute per operation name, compute busy, exposed NCCL, idle (engine.time_per_step).
    time_per_step: dict[str, Any] = field(default_factory=dict)
    health: list[str] = field(default_factory=list)  # what was asked for and is missing
    # nsys GPU metrics (profile.nsys.gpu_metrics): each sampled metric's mean over the window, by nsys's name.
    gpu_metrics: dict[str, float] = field(default_factory=dict)
    # The profiler's own cost (overhead.py): the mean profiled step (time_per_step, mean over ranks),
    # the run's measured (untraced) step time (summary.json), and how much slower the first ran.
    profiled_step_ms: float | None = None
    measured_step_ms: float | None = None
    profiler_overhead_pct: float | None = None
    # A fingerprint of the blocks the captured steps trained (summary.json's info; torch backend): two runs
    # whose fingerprints differ profiled other data, and attention's time moves with the documents.
    captured_blocks: str | None = None
    # Added after the numbers (run_analysis.py, ranks.py):
    roofline: dict[str, Any] = field(default_factory=dict)  # Nsight Compute points of the top kernels
    findings: list[Finding] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)  # one row per rank of a run on several GPUs

    def metrics(self) -> dict[str, float]:
        """The METRICS this analysis measured, as MLflow takes them."""
        return {k: float(v) for k in METRICS if (v := getattr(self, k)) is not None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "profile analysis") -> ProfileAnalysis:
        """ProfileError naming `where` when `raw` has a key no analysis has."""
        unknown = sorted(set(raw) - {f.name for f in fields(cls)})
        if unknown:
            raise ProfileError(f"{where}: not a profile analysis: unknown keys {', '.join(unknown)}")
        return cls(**{**raw, "findings": [Finding(**f) for f in raw.get("findings", [])]})

    def save(self, run_dir: Path) -> Path:
        path = run_dir / PROFILE_ANALYSIS
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str))
        return path
