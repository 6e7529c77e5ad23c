"""The analysis engine both readers share (nsys: nsys_analysis.py, PyTorch traces: torch_trace.py):
each reader turns its source into device operations (timeline.Ops) and host evidence
(GapEvidence); from there the window, gaps and their causes, and the metrics are computed here,
once, so both sources mean the same by every number (definitions: analysis.py).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ghsweep.profile import kernel_kinds
from ghsweep.profile import steps as step_finder
from ghsweep.profile.timeline import EDGE, Ops, Timeline, timeline, union_ns

GAP_BUCKETS = (
    (0, 10_000, "<10us"),
    (10_000, 100_000, "10-100us"),
    (100_000, 1_000_000, "0.1-1ms"),
    (1_000_000, 10_000_000, "1-10ms"),
    (10_000_000, None, ">=10ms"),
)
# Gaps shorter than this are the normal spacing of back-to-back kernels, not idle periods.
IDLE_GAP_MIN_NS = 10_000
# short_gaps: gaps under IDLE_GAP_MIN_NS, the spacing of back-to-back work, not attributed one by one.
# In the order attribute() tries them (first match wins).
GAP_CAUSES = ("sync", "host_wait", "unified_memory", "data_loading", "launch_latency", "unattributed", "short_gaps")
MEMCPY_KIND = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP", 11: "UM HtoD", 12: "UM DtoH", 13: "UM DtoD"}
PEER_COPY_KIND = 10  # PtoP: between two GPUs (kernel_kinds.PEER_COPY)
UM_KINDS = (11, 12, 13)
MEM_KIND = {0: "pageable", 1: "pinned", 2: "device", 4: "managed", 7: "unknown"}
WHOLE_TRACE_KERNELS = 50
# An NVTX step whose GPU work spans less than this share of its host time is mostly CPU: the
# window covers the steps, not just the GPU work.
MOSTLY_CPU_SHARE = 0.5
TOP_GAPS = 5  # longest gaps kept per cause (the evidence a report lists with their times)
TIME_MAPPED = (
    "no CUDA runtime API calls with correlation ids: the steps were mapped onto the GPU by time, not "
    "through their launches (the GPU's lag behind the host shifts the window)"
)
NO_STEPS = (
    'no step ranges (NVTX ranges named like "step N", "iteration N", "train_step", "ProfilerStep#N") '
    "and no repeating GPU work that marks steps (optimizer-kernel bursts, a kernel recurring at a fixed period)"
)


def pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


def gap_stats(buckets: list[tuple[int, int]], idle_gaps: list[int], max_ns: int, steps: int) -> dict:
    """Histogram of all gaps; count, quantiles and per-step rate of idle gaps (>= IDLE_GAP_MIN_NS)."""
    ordered = sorted(idle_gaps)

    def quantile(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0

    return {
        "count": sum(c for c, _ in buckets),
        "total_ns": sum(t for _, t in buckets),
        "max_ns": max_ns,
        "histogram": [
            {"bucket": label, "count": c, "total_ns": t} for (_, _, label), (c, t) in zip(GAP_BUCKETS, buckets)
        ],
        "idle_gaps": len(ordered),
        "idle_gaps_per_step": len(ordered) / steps if steps else float(len(ordered)),
        "idle_p50_ns": quantile(0.5),
        "idle_p95_ns": quantile(0.95),
    }


def gap_block(line: Timeline, evidence: GapEvidence, steps: int) -> dict:
    """The gaps of the window's timeline: statistics, idle time per cause (GAP_CAUSES, one set
    for every source; short_gaps is the rest of the gap time), and per cause the longest gaps with
    their times, so every number a finding quotes can be found on the timeline."""
    causes, top = evidence.attribute(line.long_gaps)
    info = gap_stats(line.gap_buckets, [e - s for s, e, _ in line.long_gaps], line.gap_max_ns, steps)
    causes["short_gaps"] = info["total_ns"] - sum(causes.values())
    info["causes_ns"] = causes
    info["top_gaps"] = top
    info["os_waits_traced"] = evidence.os_waits_traced
    return info


def window_timeline(ops: Ops, window: tuple[int, int]) -> Timeline:
    """The device operations' timeline inside the window (clipped to it), with the idle time
    between the window's edges and the first and last operation counted as gaps (a window that
    covers a mostly-CPU step is mostly such time)."""
    at = np.array(window, np.int64)
    edges = Ops(at, at.copy(), np.full(2, EDGE, np.int64), np.full(2, -1, np.int64))
    return timeline(Ops.concat([ops.clip(*window), edges]), [(lo, hi) for lo, hi, _ in GAP_BUCKETS], IDLE_GAP_MIN_NS)


class Intervals:
    """Sorted, merged intervals with an overlap test (bisect)."""

    def __init__(self, spans):
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = [s for s, _ in merged]
        self.ends = [e for _, e in merged]

    def overlaps(self, start: int, end: int) -> bool:
        i = bisect.bisect_left(self.starts, end)  # intervals starting before `end`
        return i > 0 and self.ends[i - 1] > start

    def first_overlap_end(self, start: int, end: int) -> int | None:
        """The end of the earliest interval overlapping (start, end), None when none does."""
        first = bisect.bisect_right(self.ends, start)  # merged intervals: ends are sorted too
        return self.ends[first] if first < len(self.starts) and self.starts[first] < end else None


@dataclass
class GapEvidence:
    """What the host was doing while the GPU idled, as interval sets (host times, ns)."""

    sync: Intervals = field(default_factory=lambda: Intervals([]))  # synchronising calls, blocking copies
    waits: dict[int, Intervals] = field(default_factory=dict)  # OS waits, per thread
    unified_memory: Intervals = field(default_factory=lambda: Intervals([]))  # phases with UM faults/migrations
    data: Intervals = field(default_factory=lambda: Intervals([]))  # "data*" ranges
    launches: Mapping[int, tuple[int, int | None]] = field(default_factory=dict)  # correlation -> (launch, thread)
    # Whether the OS's waits were recorded at all (nsys with osrt): without them a launch held up by a wait
    # in the OS cannot be told from a host that was busy, and both read as launch latency.
    os_waits_traced: bool = False

    def cause(self, start: int, end: int, corr: int) -> str:
        """The cause of the idle gap (start, end) ended by the operation launched as `corr`; the
        first match of GAP_CAUSES' order wins (findings.py writes the order down).

        A synchronising call explains the gap only when the work ending it was launched after the
        call returned (the host was held there); work queued before the sync (a CUDA graph
        launched ahead) was not delayed by it. Without the launch (no correlation), overlap alone."""
        launch_start, launch_tid = self.launches.get(corr, (None, None))
        sync_end = self.sync.first_overlap_end(start, end)
        if sync_end is not None and (launch_start is None or launch_start >= sync_end):
            return "sync"
        if launch_start is None:
            launch_start = start
        if launch_tid in self.waits and self.waits[launch_tid].overlaps(start, end):
            return "host_wait"
        if self.unified_memory.overlaps(start, end):
            return "unified_memory"
        if self.data.overlaps(start, end):
            return "data_loading"
        if launch_start > start:
            return "launch_latency"
        return "unattributed"

    def attribute(self, gaps: list[tuple[int, int, int]]) -> tuple[dict[str, int], dict[str, list[dict]]]:
        """Idle time per cause of the idle gaps (start, end, correlation id of the op ending it),
        and per cause its TOP_GAPS longest gaps (start_ns, end_ns, ms)."""
        causes = dict.fromkeys(GAP_CAUSES, 0)
        by_cause: dict[str, list[tuple[int, int]]] = {}
        for start, end, corr in gaps:
            cause = self.cause(start, end, corr)
            causes[cause] += end - start
            by_cause.setdefault(cause, []).append((start, end))
        top = {
            cause: [
                {"start_ns": s, "end_ns": e, "ms": (e - s) / 1e6}
                for s, e in sorted(spans, key=lambda g: g[0] - g[1])[:TOP_GAPS]
            ]
            for cause, spans in by_cause.items()
        }
        return causes, top


# Kernels of one stream run one after another (with programmatic dependent launch, the next may
# start before the previous ends, never end before it): a kernel inside the previous one of its
# stream by more than this is not clock jitter.
STREAM_OVERLAP_TOLERANCE_NS = 1_000


def event_health(start: np.ndarray, end: np.ndarray, stream: np.ndarray, what: str) -> list[str]:
    """Profile-health lines for device events no real timeline has: negative durations, and
    events overlapping the previous one of their stream (shuffled or skewed timestamps). Each line
    names how many and the first one's time, so the damage can be found in the file.
    Overlap means inside the previous event of the stream: starting before it ends is a
    programmatic dependent launch (cuBLAS split-K reductions on Hopper), a real timeline."""
    lines = []
    negative = np.flatnonzero(end < start)
    if len(negative):
        i = int(negative[0])
        lines.append(
            f"{len(negative)} {what} end before they start (negative durations; the first at {int(start[i])} ns, "
            f"{(int(end[i]) - int(start[i])) / 1e3:.1f} us): a damaged trace; times computed from them are wrong"
        )
    order = np.lexsort((start, stream))
    order = order[stream[order] >= 0]  # a stream of -1 is unknown: no order to check
    s, e, k = start[order], end[order], stream[order]
    same = k[1:] == k[:-1]
    tol = STREAM_OVERLAP_TOLERANCE_NS
    overlap = np.flatnonzero(same & (s[1:] < e[:-1] - tol) & (e[1:] < e[:-1] - tol) & (e[1:] >= s[1:]))
    if len(overlap):
        i = int(overlap[0]) + 1
        lines.append(
            f"{len(overlap)} {what} run inside the previous one of their stream (the first at "
            f"{int(s[i])} ns on stream {int(k[i])}): a stream runs one at a time, so the timestamps are "
            "shuffled or skewed; busy and idle times may be wrong"
        )
    return lines


def memory_ops(groups: list[tuple]) -> dict:
    """Per direction and host memory kind: count, bytes, time, bandwidth; pageable and UM totals."""
    rows: list[dict[str, Any]] = []
    by_kind: dict[str, dict[str, int]] = {}
    big_pageable = {"count": 0, "bytes": 0}
    for kind, src, dst, count, ns, nbytes, big_n, big_b in groups:
        label = MEMCPY_KIND.get(kind, f"kind {kind}")
        rows.append(
            {
                "kind": label,
                "src": MEM_KIND.get(src, str(src)),
                "dst": MEM_KIND.get(dst, str(dst)),
                "count": count,
                "bytes": nbytes,
                "total_ns": ns,
                "gb_per_s": nbytes / ns if ns else 0.0,
            }
        )
        entry = by_kind.setdefault(label, {"count": 0, "bytes": 0, "total_ns": 0})
        entry["count"] += count
        entry["bytes"] += nbytes
        entry["total_ns"] += ns
        if 0 in (src, dst) and kind not in UM_KINDS:
            big_pageable["count"] += big_n or 0
            big_pageable["bytes"] += big_b or 0
    return {"copies": sorted(rows, key=lambda r: -r["total_ns"]), "by_kind": by_kind, "pageable_big": big_pageable}


def infer_steps(
    start: np.ndarray, end: np.ndarray, keys: np.ndarray, names: dict[int, str]
) -> step_finder.Steps | None:
    """Steps from kernels sorted by start, keyed by name (`names`: key -> kernel name): optimizer
    bursts, else the period of the kernel sequence."""
    optimizer = sorted(k for k, n in names.items() if kernel_kinds.is_optimizer(n))
    what = ", ".join(sorted({kernel_kinds.function_name(names[k]) for k in optimizer}))[:120]
    found = step_finder.from_optimizer_bursts(start, end, np.isin(keys, optimizer), what)
    if found is None:
        found = step_finder.from_repeats(start, end, keys, {k: kernel_kinds.function_name(n) for k, n in names.items()})
    return found


def steady_window(
    found: step_finder.Steps | None,
    health: list[str],
    project: Callable[[list[step_finder.Step]], tuple[tuple[int, int] | None, bool]],
    no_gpu_work: str,
) -> tuple[step_finder.Steps, tuple[int, int] | None]:
    """The steps and the GPU time window of their steady state; None: the whole trace (health says why).

    NVTX steps are CPU ranges: `project` maps them onto the GPU work they launched and says whether
    it could do so through correlation ids (else by time). Stub steps (no work, far shorter than
    the rest) are dropped first. When the first steady step's GPU work spans under half of its
    host time (a step that is mostly CPU), the window covers the steps too: the GPU's idle time
    there is the step's. Inferred steps are GPU time already.
    """
    if found is None:
        return whole_trace_steps(health, NO_STEPS), None
    if found.basis != step_finder.NVTX_BASIS:
        return found, (found.steady[0].start, found.steady[-1].end)
    found = step_finder.without_stubs(found, lambda step: project([step])[0] is not None)
    window, projected = project(found.steady)
    if window is None:
        return whole_trace_steps(health, f"the steps ({found.source}) {no_gpu_work}"), None
    if not projected:
        health.append(TIME_MAPPED)
    first, _ = project(found.steady[:1])
    if first is None or first[1] - first[0] < MOSTLY_CPU_SHARE * found.steady[0].duration:
        window = (min(window[0], found.steady[0].start), max(window[1], found.steady[-1].end))
    return found, window


def whole_trace_steps(health: list[str], why: str) -> step_finder.Steps:
    health.append(f"{why}: the window is the whole trace, start-up and warm-up included")
    return step_finder.Steps()


def window_block(window: tuple[int, int], found: step_finder.Steps) -> dict:
    return {
        "start_ns": window[0],
        "end_ns": window[1],
        "duration_ns": window[1] - window[0],
        "basis": found.basis,
        "source": found.source,
        "steps": [s.step for s in found.steady],
        "warmup_steps": [s.step for s in found.warmup],
        "warmup_reason": found.warmup_reason,
        "stub_steps": [{"step": s.step, "start_ns": s.start, "end_ns": s.end} for s in found.stubs],
    }


def device_metrics(
    line: Timeline, span: int, gap_info: dict, kernel_ns: int, copy_ns: int, set_ns: int, mem: dict
) -> dict:
    """The metrics of result.METRICS, the same for both sources (kernel/copy/set_ns: the summed
    durations the reader counts in the window)."""
    busy_ns, exposed_ns = line.busy_ns, line.kernel_or_copy_ns - line.kernel_union_ns
    ops_ns = kernel_ns + copy_ns + set_ns
    um_ns = sum(v["total_ns"] for k, v in mem["by_kind"].items() if k.startswith("UM"))
    return {
        "gpu_busy_pct": pct(busy_ns, span),
        "gpu_idle_pct": 100.0 - pct(busy_ns, span),
        "idle_gaps_per_step": gap_info["idle_gaps_per_step"],
        "kernel_time_pct": pct(kernel_ns, ops_ns),
        "memcpy_time_pct": pct(copy_ns, ops_ns),
        "memset_time_pct": pct(set_ns, ops_ns),
        "exposed_memcpy_pct": pct(exposed_ns, span),
        "um_migration_pct": pct(um_ns, copy_ns + set_ns),
        "h2d_gb": sum(v["bytes"] for k, v in mem["by_kind"].items() if k in ("HtoD", "UM HtoD")) / 1e9,
        "d2h_gb": sum(v["bytes"] for k, v in mem["by_kind"].items() if k in ("DtoH", "UM DtoH")) / 1e9,
    }


def time_per_step(
    start: np.ndarray, end: np.ndarray, keys: np.ndarray, names: Mapping[int, str], window: tuple[int, int], steps: int
) -> dict:
    """Where a mean steady step's time went, in ms, from the window's device operations (start,
    end, key into `names`: a kernel's function name, a copy's direction, "Memset"): per name, the
    time of every operation that is not communication (compute) and of each communicating one (NCCL's
    kernels, peer-to-peer copies: kernel_kinds.is_communication); the union of the compute
    (compute_busy); communication with no compute beside it (exposed_comm); nothing running (idle).
    step = compute_busy + exposed_comm + idle exactly, which is what lets scaling.py split a
    difference of steps without remainder. Vectorised: a big export has millions of kernels."""
    w0, w1 = window
    s, e = np.maximum(start, w0), np.minimum(end, w1)
    keep = e > s
    s, e, k = s[keep], e[keep], keys[keep]
    comm = np.isin(k, [key for key, name in names.items() if kernel_kinds.is_communication(name)])
    order = np.lexsort((e, s))
    s, e, k, comm = s[order], e[order], k[order], comm[order]
    per = max(steps, 1) * 1e6
    compute_busy = union_ns(s[~comm], e[~comm])
    busy = union_ns(s, e)

    def by_name(chosen: np.ndarray) -> dict[str, float]:
        uniq, inverse = np.unique(k[chosen], return_inverse=True)
        totals = np.bincount(inverse.ravel(), weights=(e - s)[chosen].astype(np.float64), minlength=len(uniq))
        out: dict[str, float] = {}
        for key, ns in zip(uniq.tolist(), totals.tolist()):
            name = names.get(key, str(key))
            out[name] = out.get(name, 0.0) + ns / per
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    return {
        "step_ms": (w1 - w0) / per,
        "compute_busy_ms": compute_busy / per,
        "exposed_comm_ms": (busy - compute_busy) / per,
        "comm_ms": float((e - s)[comm].sum()) / per,
        "idle_ms": (w1 - w0 - busy) / per,
        "compute_by_name_ms": by_name(~comm),
        "comm_by_name_ms": by_name(comm),  # each communicating operation's time (delta.py tells them apart)
    }


def step_times(found: step_finder.Steps) -> dict:
    if not found.steady:
        return {}
    return {
        "median": statistics.median(s.duration for s in found.steady) / 1e6,
        "first": found.all[0].duration / 1e6,
        "all": [round(s.duration / 1e6, 3) for s in found.all],
    }


def whole_trace_block(kernels: dict, memory_ops: dict) -> dict:
    """kernels: {ranked, count, total_ns} of every kernel; memory_ops: {kind: {count, total_ns, bytes}}."""
    return {
        "kernels": kernels["ranked"][:WHOLE_TRACE_KERNELS],
        "distinct_kernels": len(kernels["ranked"]),
        "kernel_count": kernels["count"],
        "kernel_total_ns": kernels["total_ns"],
        "memory_ops": memory_ops,
    }
