"""Findings in words from a ProfileAnalysis: each rule fires with its evidence (the numbers that
made it fire), so a reader can check it. Thresholds are module constants, tuned on the planted
H200 scenarios in tests/data/profiles (a clean compute-bound run fires none).

`context` is what the run's config says (precision, offload and the torch backend's offload prefetch,
memory; empty from the command line): it sharpens the wording and enables the rules that need to know
what was asked for (fp8).

Attribution follows the evidence. Each idle gap of the GPU gets one cause, the first that matches
in this order (engine.GapEvidence.cause):
  1. sync            a synchronising call or blocking copy of the process overlaps the gap, and
                     the work ending the gap was launched after that call returned (work queued
                     before it, a CUDA graph launched ahead, was not held back by it)
  2. host_wait       the thread that launched the work ending the gap was in an OS wait
  3. unified_memory  the gap overlaps a phase range (data/forward/backward/optimizer) inside which
                     unified-memory CPU page faults or migrations happened, or a fault itself
  4. data_loading    the gap overlaps a "data*" range or PyTorch's own DataLoader range
                     (enumerate(DataLoader)#..., _SingleProcess/_MultiProcessingDataLoaderIter.__next__)
                     with no unified-memory evidence in it
  5. launch_latency  the work ending the gap was launched after the gap began (the host was late)
  6. unattributed
The findings then read those shares: data_loading fires on causes 2 + 4 only, so a data phase
slowed by page faults is a unified-memory finding, never "raise num_workers".
Rules (all that match fire; findings listed in this order): profiler_overhead, sweep_overlap,
profile_health, then RULES: gpu_starved, data_loading, host_sync, launch_bound, pageable_copies,
offload_cost / exposed_memcpy, um_migrations, fp8_not_effective, gpu_metrics, roofline_*.

The profiler's own cost (overhead.py: profiled step - measured step, where the run's measured step
is known) is taken off the idle causes it shows as (net_causes) before the rules read them, so an
idle or launch finding is the run's own, stated net of the profiler.

Findings that repeat: a threshold rule reads its figure as an interval, the figure +- its band
(STARVED_BAND_PCT, ...: how far repeats of one configuration move it). Wholly past the threshold:
a warning; holding the threshold: info, said to be not established (evidence established=False, kept
out of a run's top finding); wholly short of it: no finding. Two repeats whose figures agree within
their bands either side of a threshold therefore get the same findings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ghsweep.profile.nsys_db import SHORT_KERNEL_NS
from ghsweep.profile.result import Finding, ProfileAnalysis
from ghsweep.profile.steps import WHOLE_TRACE

STARVED_BUSY_PCT = 85.0  # steady-state device utilisation below this: the GPU waits
IDLE_MIN_PCT = 10.0  # idle share of the window worth explaining
MAJORITY = 0.5  # a cause that explains this much of the idle time is "the" cause
SYNC_MIN_PCT = 5.0  # idle time at synchronising calls, % of the window
LAUNCH_MIN_PCT = 5.0  # idle time waiting for late launches, % of the window
EXPOSED_MEMCPY_MIN_PCT = 5.0
UM_WARN_PCT = 5.0  # unified-memory migrations' share of memory-operation time
# With precision=fp8, fp8 GEMMs (kernel_kinds.is_fp8_gemm) below this share of GEMM time: the
# matmuls still run in bf16/fp16 (a working fp8 recipe leaves only lm_head and adapters in bf16).
FP8_MIN_GEMM_SHARE = 0.5
# Profiled steps this much slower than the measured (untraced) ones: the profiler_overhead finding.
OVERHEAD_FINDING_PCT = 5.0
# Each figure's interval is the figure +- its band: how far repeats of one configuration move it
# (the H200 repeats of tests/data/profiles: host sync 4.0 and 4.5%; the profiler's overhead 4.0 and
# 6.2% in one sweep, 1.5 and 2.8% in another). In the threshold's unit: points of % for shares, a
# share for MAJORITY.
STARVED_BAND_PCT = 3.0
IDLE_BAND_PCT = 2.0
MAJORITY_BAND = 0.1
SYNC_BAND_PCT = 1.5
LAUNCH_BAND_PCT = 1.5
OVERHEAD_BAND_PCT = 1.5


def finding(id_: str, severity: str, message: str, **evidence) -> Finding:
    return Finding(id_, severity, message, evidence)


def level(value: float, threshold: float, band: float, below: bool = False) -> str | None:
    """`warning` when the interval value +- band lies wholly past the threshold (below it, with
    `below`), `info` when it holds the threshold (not established), None when wholly short of it."""
    past, short = (
        (value + band < threshold, value - band >= threshold)
        if below
        else (
            value - band >= threshold,
            value + band < threshold,
        )
    )
    if past:
        return "warning"
    return None if short else "info"


def near(value: float, threshold: float, band: float, unit: str = "%") -> str:
    """The note of a finding whose figure's interval holds its threshold."""
    return (
        f" (not established: {value:.1f}{unit} +- {band:g} (what repeats move it by) holds the {threshold:g}{unit} "
        "threshold)"
    )


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def window_words(a: ProfileAnalysis) -> str:
    """What the window is, for sentences: the steady-state steps, or the whole trace."""
    return "the whole trace" if a.window.get("basis") == WHOLE_TRACE else "the steady state"


@dataclass
class Window:
    """What every rule reads of the analysed window: its length, steps, idle causes, and the words
    for amounts (per step over steady steps; over the whole trace, totals, said so).

    `overhead_ns`: the profiler's own time in the window (profiled - measured steps); the causes
    are net of it (net_causes), idle_ns too."""

    ns: int
    steps: int
    per_step: str
    of_step: str
    causes: dict[str, int]
    idle_ns: int
    overhead_ns: int = 0  # the profiler's time taken off the causes (OVERHEAD_SHOWS_AS)
    unabsorbed_ns: int = 0  # the rest of it: inside other causes, or nowhere to be told apart

    @classmethod
    def of(cls, a: ProfileAnalysis) -> Window:
        stepped = bool(a.window.get("steps"))
        steps = max(1, len(a.window.get("steps") or []))
        traced = a.gaps.get("causes_ns", {})
        extra = 0
        if stepped and a.profiled_step_ms is not None and a.measured_step_ms is not None:
            extra = int(max(0.0, a.profiled_step_ms - a.measured_step_ms) * steps * 1e6)
        causes, unabsorbed = net_causes(traced, extra)
        return cls(
            a.window["duration_ns"],
            steps,
            "per step" if stepped else "in the whole trace",
            "of each step" if stepped else "of the whole trace",
            causes,
            sum(causes.values()),
            sum(traced.values()) - sum(causes.values()),
            unabsorbed,
        )

    def ms_per_step(self, ns: float) -> float:
        return ns / self.steps / 1e6

    @property
    def net_ns(self) -> int:
        """The window less the profiler's own time."""
        return self.ns - self.overhead_ns

    def not_established(self, still_fires: bool) -> str:
        """The note for a finding that would not fire were the profiler's unabsorbed time in its cause."""
        if still_fires or not self.unabsorbed_ns:
            return ""
        return (
            f" (not established: the profiler's other {self.ms_per_step(self.unabsorbed_ns):.2f} ms {self.per_step} "
            "may be in it)"
        )

    def net_words(self) -> str:
        return (
            f", net of the profiler's {self.ms_per_step(self.overhead_ns):.2f} ms {self.per_step}"
            if self.overhead_ns
            else ""
        )


# The causes the profiler's per-launch cost shows as (the host late to launch, back-to-back spacing
# stretched, gaps nothing else explains), in the order its time is taken off them.
OVERHEAD_SHOWS_AS = ("launch_latency", "short_gaps", "unattributed")


def net_causes(causes: dict[str, int], overhead_ns: int) -> tuple[dict[str, int], int]:
    """(idle time per cause less the profiler's `overhead_ns`, taken off OVERHEAD_SHOWS_AS in order,
    and what was left of it). A tracer creates those causes; what is left may be in the others
    (OS-runtime tracing slows the host's waits), so the findings reading them say it is not established."""
    out, left = dict(causes), overhead_ns
    for cause in OVERHEAD_SHOWS_AS:
        taken = min(left, out.get(cause, 0))
        if taken:
            out[cause] -= taken
            left -= taken
    return out, left


def profiler_overhead(a: ProfileAnalysis) -> list[Finding]:
    """The profiled steps slower than the measured ones by OVERHEAD_FINDING_PCT or more (overhead.py)."""
    pct_ = a.profiler_overhead_pct
    if pct_ is None or a.profiled_step_ms is None or a.measured_step_ms is None:
        return []
    severity = level(pct_, OVERHEAD_FINDING_PCT, OVERHEAD_BAND_PCT)
    if severity is None:
        return []
    extra = a.profiled_step_ms - a.measured_step_ms
    return [
        finding(
            "profiler_overhead",
            severity,
            f"the profiler slowed the steps it traced by {pct_:.1f}% ({a.profiled_step_ms:.1f} ms a profiled step "
            f"against {a.measured_step_ms:.1f} ms measured untraced): GPU idle and launch-gap figures of this "
            f"profile are inflated by about {extra:.1f} ms per step; the findings below are stated net of it, or "
            "marked not established where it may hide in their cause (a smaller trace set, "
            "profile.nsys.trace=[cuda,nvtx], costs less)"
            + (near(pct_, OVERHEAD_FINDING_PCT, OVERHEAD_BAND_PCT) if severity == "info" else ""),
            established=severity == "warning",
            profiled_step_ms=a.profiled_step_ms,
            measured_step_ms=a.measured_step_ms,
            profiler_overhead_pct=pct_,
            overhead_ms_per_step=extra,
        )
    ]


def sweep_overlap(overlap: str | None) -> list[Finding]:
    """The sweep's follow-up work on earlier runs found to run beside this run's steps (overhead.py)."""
    if not overlap:
        return []
    return [
        finding(
            "sweep_overlap",
            "warning",
            f"{overlap}: this run's step times and profile may be slowed by the tool's own work",
            overlap=overlap,
        )
    ]


def gpu_starved(a: ProfileAnalysis, w: Window, context: dict) -> list[Finding]:
    if a.gpu_busy_pct is None:  # no device (evaluate runs no rule then)
        return []
    busy = 100.0 * _share(w.net_ns - w.idle_ns, w.net_ns) if w.overhead_ns else a.gpu_busy_pct
    severity = level(busy, STARVED_BUSY_PCT, STARVED_BAND_PCT, below=True)
    if severity is None:
        return []
    worst = 100.0 * _share(w.net_ns - w.idle_ns, w.net_ns - w.unabsorbed_ns)
    unsure = w.not_established(level(worst, STARVED_BUSY_PCT, STARVED_BAND_PCT, below=True) is not None)
    severity = "info" if unsure else severity
    top = max(w.causes, key=w.causes.__getitem__) if w.idle_ns else "unattributed"
    return [
        finding(
            "gpu_starved",
            severity,
            f"GPU busy only {busy:.1f}% of {window_words(a)}{w.net_words()} ({100 - busy:.1f}% idle, "
            f"{w.ms_per_step(w.idle_ns):.2f} ms idle {w.per_step}); most idle time: {top.replace('_', ' ')}"
            + (unsure or (near(busy, STARVED_BUSY_PCT, STARVED_BAND_PCT) if severity == "info" else "")),
            established=severity == "warning",
            gpu_busy_pct=busy,
            traced_gpu_busy_pct=a.gpu_busy_pct,
            idle_ms_per_step=w.ms_per_step(w.idle_ns),
            main_cause=top,
        )
    ]


def data_loading(a: ProfileAnalysis, w: Window, context: dict) -> list[Finding]:
    loading = w.causes.get("data_loading", 0) + w.causes.get("host_wait", 0)
    idle = level(_share(w.idle_ns, w.net_ns) * 100, IDLE_MIN_PCT, IDLE_BAND_PCT)
    mostly = level(_share(loading, w.idle_ns), MAJORITY, MAJORITY_BAND)
    if idle is None or mostly is None:
        return []
    severity = "warning" if idle == mostly == "warning" else "info"
    rest = min(w.unabsorbed_ns, loading)
    unsure = w.not_established(
        level(_share(w.idle_ns - rest, w.net_ns - rest) * 100, IDLE_MIN_PCT, IDLE_BAND_PCT) is not None
        and level(_share(loading - rest, w.idle_ns - rest), MAJORITY, MAJORITY_BAND) is not None
    )
    severity = "info" if unsure else severity
    idle_pct, loading_pct = 100 * _share(w.idle_ns, w.net_ns), 100 * _share(loading, w.idle_ns)
    note = unsure or (
        near(idle_pct, IDLE_MIN_PCT, IDLE_BAND_PCT)
        if idle == "info"
        else near(loading_pct, 100 * MAJORITY, 100 * MAJORITY_BAND)
        if mostly == "info"
        else ""
    )
    workers = context.get("num_workers")
    advice = "raise dataloader.num_workers" + (f" (now {workers})" if workers is not None else "")
    return [
        finding(
            "data_loading",
            severity,
            f"data-loading bound: the data loader stalls the GPU {w.ms_per_step(loading):.2f} ms {w.per_step} "
            f"({loading_pct:.0f}% of the GPU idle time{w.net_words()}: the host inside "
            f"DataLoader or data ranges, or waiting); the lever is the loader's worker processes: {advice}, then "
            "pin memory and prefetch" + note,
            established=severity == "warning",
            data_loading_ms_per_step=w.ms_per_step(w.causes.get("data_loading", 0)),
            host_wait_ms_per_step=w.ms_per_step(w.causes.get("host_wait", 0)),
            share_of_idle_pct=loading_pct,
            longest_gaps=a.gaps.get("top_gaps", {}).get("data_loading", [])
            + a.gaps.get("top_gaps", {}).get("host_wait", []),
        )
    ]


def host_sync(a: ProfileAnalysis, w: Window, context: dict) -> list[Finding]:
    sync_pct = 100 * _share(w.causes.get("sync", 0), w.net_ns)
    severity = level(sync_pct, SYNC_MIN_PCT, SYNC_BAND_PCT)
    if severity is None:
        return []
    rest = min(w.unabsorbed_ns, w.causes.get("sync", 0))
    worst = 100 * _share(w.causes.get("sync", 0) - rest, w.net_ns - rest)
    unsure = w.not_established(level(worst, SYNC_MIN_PCT, SYNC_BAND_PCT) is not None)
    severity = "info" if unsure else severity
    return [
        finding(
            "host_sync",
            severity,
            f"host synchronisation: the GPU sits idle while the host waits in synchronising calls and launches the "
            f"next work only after they return, for {sync_pct:.1f}% {w.of_step} "
            f"({w.ms_per_step(w.causes['sync']):.2f} ms {w.per_step}); remove .item()/.cpu()/print of GPU values "
            "from the step, or do them every N steps"
            + (unsure or (near(sync_pct, SYNC_MIN_PCT, SYNC_BAND_PCT) if severity == "info" else "")),
            established=severity == "warning",
            sync_idle_pct=sync_pct,
            sync_ms_per_step=w.ms_per_step(w.causes["sync"]),
            longest_gaps=a.gaps.get("top_gaps", {}).get("sync", []),
        )
    ]


# What launch_bound adds where the OS's waits were not recorded (nsys without osrt, PyTorch profiler
# traces); an analysis written before the flag existed came from a default trace set with osrt.
UNTRACED_WAITS = (
    ", unless the host was waiting in the OS, which this profile did not record "
    "(profile.nsys.trace=[cuda,nvtx,osrt] tells the two apart)"
)


def launch_bound(a: ProfileAnalysis, w: Window, context: dict) -> list[Finding]:
    """Launch bound when the host is late for many launches, not one: the longest late-launch gap
    and the longest launch call (a first launch loading modules takes seconds) are left out of
    the evidence before the thresholds are applied."""
    kernels = a.kernels
    late = a.gaps.get("top_gaps", {}).get("launch_latency", [])
    longest_ns = int(late[0]["ms"] * 1e6) if late else 0
    launch_pct = 100 * _share(w.causes.get("launch_latency", 0), w.net_ns)
    spread_pct = 100 * _share(max(0, w.causes.get("launch_latency", 0) - longest_ns), w.net_ns)
    short = kernels.get("short_pct", 0) >= 50  # the median kernel is shorter than 10 us
    launch_heavy = (
        kernels.get("launch_api_ns", 0) - kernels.get("launch_api_max_ns", 0) >= kernels.get("total_ns", 0) > 0
    )
    severity = level(spread_pct, LAUNCH_MIN_PCT, LAUNCH_BAND_PCT)
    if severity is None or not (short or launch_heavy):
        return []
    return [
        finding(
            "launch_bound",
            severity,
            f"launch bound: the GPU waits for the host to launch work for {launch_pct:.1f}% {w.of_step}{w.net_words()} "
            f"({kernels.get('short_pct', 0):.0f}% of kernels under {SHORT_KERNEL_NS / 1e3:.0f} us, launch calls "
            f"{kernels.get('launch_api_ns', 0) / 1e6:.1f} ms vs kernels {kernels.get('total_ns', 0) / 1e6:.1f} ms); "
            "use CUDA graphs or torch.compile to launch fewer, larger kernels"
            + ("" if a.gaps.get("os_waits_traced", True) else UNTRACED_WAITS)
            + (near(spread_pct, LAUNCH_MIN_PCT, LAUNCH_BAND_PCT) if severity == "info" else ""),
            established=severity == "warning",
            launch_latency_pct=launch_pct,
            short_kernel_pct=kernels.get("short_pct", 0),
            longest_gaps=late,
        )
    ]


def pageable_copies(a: ProfileAnalysis, w: Window, context: dict) -> list[Finding]:
    pageable = a.memcpy.get("pageable_big", {})
    if not pageable.get("count"):
        return []
    return [
        finding(
            "pageable_copies",
            "warning",
            f"{pageable['count'] / w.steps:.1f} copies {w.per_step} of >= 1 MiB to or from pageable host memory "
            f"({pageable['bytes'] / w.steps / 2**20:.0f} MiB {w.per_step}); pageable copies are synchronous and slow: "
            "use pinned memory (pin_memory=True, tensor.pin_memory()) and non_blocking=True",
            copies_per_step=pageable["count"] / w.steps,
            mib_per_step=pageable["bytes"] / w.steps / 2**20,
        )
    ]


def exposed_copies(a: ProfileAnalysis, w: Window, context: dict) -> list[Finding]:
    """offload_cost when the exposed copies are a round trip to pinned memory (or offload is on),
    else exposed_memcpy."""
    exposed = a.exposed_memcpy_pct or 0.0
    if exposed < EXPOSED_MEMCPY_MIN_PCT:
        return []
    by_kind = {c["kind"]: c for c in a.memcpy.get("copies", []) if c["src"] == "pinned" or c["dst"] == "pinned"}
    if ("HtoD" in by_kind and "DtoH" in by_kind) or context.get("offload"):
        h2d_gb, d2h_gb = a.h2d_gb, a.d2h_gb
        # engine.device_metrics sets the transfer volumes with exposed_memcpy_pct.
        assert h2d_gb is not None and d2h_gb is not None, "exposed copies measured without their volumes"
        return [
            finding(
                "offload_cost",
                "warning",
                f"offload cost: copies to and from pinned host memory run with no kernel beside them for "
                f"{exposed:.1f}% {w.of_step} ({h2d_gb / w.steps:.2f} GB in and {d2h_gb / w.steps:.2f} GB out "
                f"{w.per_step}); {offload_levers(context.get('offload_prefetch_layers'))}",
                exposed_memcpy_pct=exposed,
                h2d_gb_per_step=h2d_gb / w.steps,
                d2h_gb_per_step=d2h_gb / w.steps,
            )
        ]
    return [
        finding(
            "exposed_memcpy",
            "warning",
            f"copies not hidden behind compute: {exposed:.1f}% {w.of_step} only copies data "
            f"(memcpy {a.memcpy_time_pct:.1f}% of GPU operation time)",
            exposed_memcpy_pct=exposed,
            memcpy_time_pct=a.memcpy_time_pct,
        )
    ]


def offload_levers(prefetch_layers: int | str | None) -> str:
    """What is left to change against exposed offload copies, given the run's offload.prefetch_layers
    (None: not known, or not the torch backend's knob)."""
    fewer = "offload fewer layers (offload.num_layers)"
    if prefetch_layers == "auto":
        # auto already brings each layer back as early as the peak allows: only fewer layers is left.
        return f"the activations already come back as early as the peak allows (offload.prefetch_layers=auto): {fewer}"
    if prefetch_layers is not None:
        return (
            f"fetch them further ahead of use (offload.prefetch_layers={prefetch_layers} now; auto: as early "
            f"as the peak allows) or {fewer}"
        )
    return (
        "overlap them with compute (a separate stream, fetched further ahead of use: offload.prefetch_layers "
        f"with the torch backend) or {fewer}"
    )


def um_migrations(a: ProfileAnalysis, w: Window, context: dict) -> list[Finding]:
    um = a.um_migration_pct or 0.0
    um_idle = w.causes.get("unified_memory", 0)
    if not (um > 0 or um_idle):
        return []
    faults = a.page_faults
    severity = "warning" if um >= UM_WARN_PCT or _share(um_idle, w.ns) * 100 >= IDLE_MIN_PCT else "info"
    fault_text = ", ".join(f"{v} {k.upper()} page faults" for k, v in faults.items()) or "page faults not traced"
    idle_text = (
        (
            f"; {w.ms_per_step(um_idle):.2f} ms {w.per_step} of GPU idle time "
            f"({100 * _share(um_idle, w.idle_ns):.0f}% of it) is in phases where the host faults on or "
            "migrates managed memory"
        )
        if um_idle
        else ""
    )
    return [
        finding(
            "um_migrations",
            severity,
            f"unified memory: migrations are {um:.1f}% of memory-operation time and "
            f"{(a.um_migration_bytes_pct or 0):.1f}% of the bytes moved ({fault_text}){idle_text}; prefetch "
            "managed memory to the GPU (cudaMemPrefetchAsync) or keep hot data in device memory",
            um_migration_pct=um,
            um_migration_bytes_pct=(a.um_migration_bytes_pct or 0),
            um_idle_ms_per_step=w.ms_per_step(um_idle),
            **faults,
        )
    ]


def fp8_not_effective(a: ProfileAnalysis, w: Window, context: dict) -> list[Finding]:
    kernels = a.kernels
    gemm_ns, fp8_ns = kernels.get("gemm_ns", 0), kernels.get("fp8_gemm_ns", 0)
    if context.get("precision") != "fp8" or not gemm_ns or fp8_ns >= FP8_MIN_GEMM_SHARE * gemm_ns:
        return []
    return [
        finding(
            "fp8_not_effective",
            "warning",
            f"precision=fp8 but only {100 * fp8_ns / gemm_ns:.0f}% of the GEMM time is in fp8 GEMMs: the matmuls "
            "still run in bf16/fp16 (check the fp8 recipe is applied to the Linear layers)",
            fp8_gemm_pct=100 * fp8_ns / gemm_ns,
            top_kernels=[k["name"][:80] for k in a.top_kernels],
        )
    ]


def roofline(a: ProfileAnalysis, w: Window, context: dict) -> list[Finding]:
    return [
        finding(
            f"roofline_{point['bound']}",
            "info",
            f"{point['name'][:60]}: {point['bound']} ({point['achieved_tflops']:.1f} TFLOP/s, "
            f"{point['pct_of_compute_peak']:.0f}% of the compute ceiling, {point['pct_of_dram_peak']:.0f}% of DRAM "
            f"bandwidth, intensity {point['intensity_dram']:.1f} FLOP/byte)",
            kernel=point["name"],
            **{k: point[k] for k in ("achieved_tflops", "pct_of_compute_peak", "pct_of_dram_peak", "intensity_dram")},
        )
        for point in a.roofline.get("kernels", [])
    ]


def _gpu_metric(a: ProfileAnalysis, names: re.Pattern, combine) -> float | None:
    """The nsys GPU metrics in % of their peak (means over the window) whose names match, combined."""
    found = [v for name, v in a.gpu_metrics.items() if name.endswith(" [Throughput %]") and names.match(name)]
    return combine(found) if found else None


# What the hardware sampled (profile.nsys.gpu_metrics), by the names nsys gives Hopper's metrics, each
# in % of its peak over the window: DRAM's read and write share one bus (summed); a link's two
# directions each have their own peak (the busier). Whole names: "Unallocated Warps in Active SMs"
# is no measure of SMs active.
GPU_METRIC_NAMES = (
    ("SMs active", re.compile(r"SMs Active \["), max),
    ("tensor cores active", re.compile(r"Tensor Active \["), max),
    ("DRAM bandwidth", re.compile(r"DRAM (Read|Write) Bandwidth \["), sum),
    ("PCIe bandwidth", re.compile(r"PCIe (RX|TX) Throughput \["), max),
    ("NVLink-C2C bandwidth", re.compile(r".*C2C.*(RX|TX|Read|Write)"), max),
)


def gpu_metrics(a: ProfileAnalysis, w: Window, context: dict) -> list[Finding]:
    shares = {
        label: v for label, names, combine in GPU_METRIC_NAMES if (v := _gpu_metric(a, names, combine)) is not None
    }
    if not shares:
        return []
    said = ", ".join(f"{label} {v:.0f}%" for label, v in shares.items())
    return [
        finding("gpu_metrics", "info", f"GPU metrics over {window_words(a)}: {said} (of each one's peak)", **shares)
    ]


# The device rules, in the order their findings are listed (each fires independently of the others).
RULES = (
    gpu_starved,
    data_loading,
    host_sync,
    launch_bound,
    pageable_copies,
    exposed_copies,
    um_migrations,
    fp8_not_effective,
    gpu_metrics,
    roofline,
)


def evaluate(a: ProfileAnalysis, context: dict | None = None, overlap: str | None = None) -> list[Finding]:
    """The findings of analysis `a` (see analysis.py for the numbers' definitions): the profiler's
    overhead and the sweep's work beside the run (`overlap`, overhead.py), profile health, then RULES
    in order; a run with no captured window or no device (a CPU run) gets those first ones only."""
    out = profiler_overhead(a) + sweep_overlap(overlap) + health(a)
    if not a.window.get("duration_ns") or a.gpu_busy_pct is None:
        return out
    window = Window.of(a)
    for rule in RULES:
        out += rule(a, window, context or {})
    return out


def health(a: ProfileAnalysis) -> list[Finding]:
    """Profile health: what was asked for and is missing, so no empty report passes as success."""
    out = [finding("profile_health", "warning", message) for message in a.health]
    impossible = impossible_shares(a)
    if impossible:
        out.append(
            finding(
                "profile_health",
                "warning",
                "shares outside 0-100%: "
                + ", ".join(f"{k} {v:.1f}%" for k, v in impossible.items())[:300]
                + " (negative durations or overlapping events in the trace; these numbers are not to be trusted)",
                **impossible,
            )
        )
    roofline = a.roofline
    if roofline.get("missing"):
        out.append(
            finding(
                "profile_health",
                "warning",
                f"ncu profiled none of these top kernels: {', '.join(roofline['missing'])[:300]}",
                missing=roofline["missing"],
            )
        )
    return out


# Kernels' share of GPU operation time at or above which a run is compute-dominated; memory
# operations are the majority (transfer-dominated) below TRANSFER_DOMINATED_KERNEL_PCT.
COMPUTE_DOMINATED_KERNEL_PCT = 90.0
TRANSFER_DOMINATED_KERNEL_PCT = 50.0


def balance_words(kernel_pct: float) -> str:
    if kernel_pct >= COMPUTE_DOMINATED_KERNEL_PCT:
        return "compute-dominated"
    if kernel_pct < TRANSFER_DOMINATED_KERNEL_PCT:
        return "transfer-dominated"
    return "mostly compute, with a sizeable share of memory operations"


# Shares that a sound trace keeps within 0-100% (the sum-of-durations shares of one kind of
# operation over all operations, busy and idle time, and each top kernel's share of kernel time).
BOUNDED_SHARES = (
    "gpu_busy_pct",
    "gpu_idle_pct",
    "kernel_time_pct",
    "memcpy_time_pct",
    "memset_time_pct",
    "exposed_memcpy_pct",
    "um_migration_pct",
    "nccl_time_pct",
    "exposed_nccl_pct",
)
SHARE_SLACK_PCT = 0.01  # rounding


def impossible_shares(a: ProfileAnalysis) -> dict[str, float]:
    values = {k: v for k in BOUNDED_SHARES if (v := getattr(a, k)) is not None}
    values |= {f"top kernel {k.get('short_name', k['name'])[:40]}": k["pct"] for k in a.top_kernels if "pct" in k}
    return {k: v for k, v in values.items() if not -SHARE_SLACK_PCT <= v <= 100 + SHARE_SLACK_PCT}


def summary(a: ProfileAnalysis) -> list[str]:
    """Plain statements about the run (not problems): the window, warm-up, the compute/transfer split."""
    lines = []
    if a.source.get("device") == "cpu":
        lines.append("a CPU run (no GPU activity in the trace): top_kernels are CPU operators by self time")
    elif a.source.get("device") == "accelerator":
        lines.append(
            "device activity of an accelerator this tool does not measure (event categories "
            f"{', '.join(a.source.get('accelerator_categories', []))}): no device metrics; top_kernels are "
            "CPU operators by self time"
        )
    window = a.window
    if window.get("basis") == WHOLE_TRACE:
        lines.append("window: the whole trace (no steps found; see profile_health)")
    elif window.get("source"):
        lines.append(f"steps from {window['source']}")
    if window.get("warmup_steps"):
        lines.append(f"warm-up excluded: {window.get('warmup_reason')}")
    kernel_pct, memcpy_pct, memset_pct = a.kernel_time_pct, a.memcpy_time_pct, a.memset_time_pct
    if a.gpu_busy_pct is not None and window.get("duration_ns"):
        # engine.device_metrics sets the operation shares together with gpu_busy_pct.
        assert kernel_pct is not None and memcpy_pct is not None and memset_pct is not None, "device metrics incomplete"
        lines.append(
            f"{kernel_pct:.1f}% kernels vs {memcpy_pct + memset_pct:.1f}% "
            f"memory operations: {balance_words(kernel_pct)}; GPU busy {a.gpu_busy_pct:.1f}% of {window_words(a)}"
        )
    return lines
