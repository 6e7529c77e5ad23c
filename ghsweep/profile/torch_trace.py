"""The same analysis as for nsys (analysis.py), from a PyTorch-profiler Chrome trace: the
portable fallback (profile=torch), which also works on a CPU-only run.

Trace times are microseconds (floats); they are turned into integer nanoseconds so every number
has the unit of the nsys path. A trace without GPU activity (a CPU run) reports the top CPU
operators by self time in `top_kernels`, and the GPU metrics as null.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from ghsweep.profile import nsys_db as db
from ghsweep.profile.analysis import (GAP_CAUSES, IDLE_GAP_MIN_NS, PHASES, Intervals, bucket_sums, empty_metrics,
                                      gap_stats, load_json, memory_ops, pct, step_times)
from ghsweep.profile.nsys_db import PAGEABLE_MIN_BYTES, SHORT_KERNEL_NS

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
SYNC_NAMES = re.compile(r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cudaMemcpy$|"
                        r"cudaStreamQuery|cuCtxSynchronize|cuStreamSynchronize)")
# "Memcpy HtoD (Pageable -> Device)"
MEMCPY_NAME = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
COPY_KIND = {"HtoD": 1, "DtoH": 2, "DtoD": 8, "PtoP": 10}
HOST_KIND = {"Pageable": 0, "Pinned": 1, "Device": 2, "Managed": 4}


def _ns(event: dict) -> tuple[int, int]:
    start = int(round(event["ts"] * 1000))
    return start, start + int(round(event.get("dur", 0) * 1000))


def analyze_torch_trace(path: Path) -> dict:
    trace = load_json(Path(path))
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    steps = sorted((db.Step(int(m.group(1)), *_ns(e)) for e in events
                    if e.get("cat") == "user_annotation" and (m := db.STEP_RANGE.match(e.get("name", "")))),
                   key=lambda s: s.start)
    warm, steady = db.split_warmup(steps)
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    props = (trace.get("deviceProperties") or [{}])[0]
    result: dict = {"source": {"path": str(path), "kind": "torch", "gpu_name": props.get("name"),
                               "device": "cuda" if gpu else "cpu"}}
    if not gpu:
        return result | cpu_only(events, steps, warm, steady)

    window = project(steady, runtime, gpu)
    basis = "nvtx steps" if window else "whole trace"
    if window is None:
        spans = [_ns(e) for e in gpu]
        window = (min(s for s, _ in spans), max(e for _, e in spans))
    w0, w1 = window
    ops = sorted((max(s, w0), min(e, w1), e_["args"].get("correlation"), e_) for e_ in gpu
                 for s, e in [_ns(e_)] if e > w0 and s < w1)
    busy, gaps, prev = 0, [], None
    for s, e, corr, _ in ops:
        if prev is not None and s > prev:
            gaps.append((prev, s, corr))
        busy += max(0, e - max(s, prev if prev is not None else s))
        prev = e if prev is None else max(prev, e)
    kernel_ns = sum(e - s for s, e, _, ev in ops if ev["cat"] == "kernel")
    copy_ns = sum(e - s for s, e, _, ev in ops if ev["cat"] == "gpu_memcpy")
    set_ns = sum(e - s for s, e, _, ev in ops if ev["cat"] == "gpu_memset")
    kernel_union = Intervals((s, e) for s, e, _, ev in ops if ev["cat"] == "kernel")
    both = Intervals((s, e) for s, e, _, ev in ops if ev["cat"] in ("kernel", "gpu_memcpy"))
    exposed = _length(both) - _length(kernel_union)

    sync = Intervals(_ns(e) for e in runtime if SYNC_NAMES.match(e.get("name", "")))
    data = Intervals(_ns(e) for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("data"))
    launch = {e["args"].get("correlation"): _ns(e)[0] for e in runtime}
    causes = dict.fromkeys(GAP_CAUSES, 0)
    lengths = [e - s for s, e, _ in gaps]
    gaps = [g for g in gaps if g[1] - g[0] >= IDLE_GAP_MIN_NS]
    for s, e, corr in gaps:
        if sync.overlaps(s, e):
            cause = "sync"
        elif data.overlaps(s, e):
            cause = "data_loading"
        elif launch.get(corr, s) > s:
            cause = "launch_latency"
        else:
            cause = "unattributed"
        causes[cause] += e - s
    n_steps = len(steady) if basis == "nvtx steps" else 0
    gap_info = gap_stats(bucket_sums(lengths), [e - s for s, e, _ in gaps], max(lengths, default=0), n_steps)
    causes["short_gaps"] = gap_info["total_ns"] - sum(causes.values())
    gap_info["causes_ns"] = causes

    groups: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for s, e, _, ev in ops:
        m = MEMCPY_NAME.match(ev["name"]) if ev["cat"] == "gpu_memcpy" else None
        if m:
            nbytes = int(ev["args"].get("bytes", 0))
            g = groups[(COPY_KIND.get(m.group(1), 0), HOST_KIND.get(m.group(2), 7), HOST_KIND.get(m.group(3), 7))]
            g[0] += 1
            g[1] += e - s
            g[2] += nbytes
            g[3] += nbytes >= PAGEABLE_MIN_BYTES
            g[4] += nbytes if nbytes >= PAGEABLE_MIN_BYTES else 0
    mem = memory_ops([(*k, *v) for k, v in groups.items()])
    span = w1 - w0
    result.update({
        "window": {"start_ns": w0, "end_ns": w1, "duration_ns": span, "basis": basis,
                   "steps": [s.step for s in steady] if basis == "nvtx steps" else [],
                   "warmup_steps": [s.step for s in warm]},
        "gpu_busy_pct": pct(busy, span),
        "gpu_idle_pct": 100.0 - pct(busy, span),
        "idle_gaps_per_step": gap_info["idle_gaps_per_step"],
        "kernel_time_pct": pct(kernel_ns, kernel_ns + copy_ns + set_ns),
        "memcpy_time_pct": pct(copy_ns, kernel_ns + copy_ns + set_ns),
        "memset_time_pct": pct(set_ns, kernel_ns + copy_ns + set_ns),
        "exposed_memcpy_pct": pct(exposed, span),
        "um_migration_pct": 0.0,  # the PyTorch profiler does not record unified-memory migrations
        "h2d_gb": mem["by_kind"].get("HtoD", {}).get("bytes", 0) / 1e9,
        "d2h_gb": mem["by_kind"].get("DtoH", {}).get("bytes", 0) / 1e9,
        "top_kernels": top_by_name([(ev["name"], e - s) for s, e, _, ev in ops if ev["cat"] == "kernel"]),
        "kernels": {"count": sum(ev["cat"] == "kernel" for *_, ev in ops), "total_ns": kernel_ns,
                    "short_pct": pct(sum(e - s < SHORT_KERNEL_NS for s, e, _, ev in ops if ev["cat"] == "kernel"),
                                     sum(ev["cat"] == "kernel" for *_, ev in ops)),
                    "launch_api_ns": sum(_ns(e)[1] - _ns(e)[0] for e in runtime if "Launch" in e.get("name", ""))},
        "memcpy": {"count": sum(v[0] for v in groups.values()), "total_ns": copy_ns, **mem},
        "memset": {"count": sum(ev["cat"] == "gpu_memset" for *_, ev in ops), "total_ns": set_ns},
        "gaps": gap_info,
        "phases_ms_per_step": phases(events, steady),
        "step_ms": step_times(steps, steady),
        "health": [] if steps else ['no "step N" ranges in the trace: the window is the whole trace'],
    })
    return result


def project(steady: list[db.Step], runtime: list[dict], gpu: list[dict]) -> tuple[int, int] | None:
    """GPU span of the work launched inside the steady steps (see nsys_db.gpu_window)."""
    if not steady:
        return None
    first, last = steady[0].start, steady[-1].end
    corrs = [e["args"].get("correlation") for e in runtime if first <= _ns(e)[0] <= last]
    corrs = [c for c in corrs if c is not None]
    if not corrs:
        return None
    lo, hi = min(corrs), max(corrs)
    spans = [_ns(e) for e in gpu if lo <= e["args"].get("correlation", -1) <= hi]
    return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else None


def cpu_only(events: list[dict], steps, warm, steady) -> dict:
    """A CPU run: top operators by self time in the steady steps; no device metrics."""
    window = (steady[0].start, steady[-1].end) if steady else None
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    if window:
        ops = [e for e in ops if window[0] <= _ns(e)[0] and _ns(e)[1] <= window[1]]
    self_ns = []
    by_thread: dict = defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(_ns(e) + (e["name"],))
    for spans in by_thread.values():
        spans.sort(key=lambda x: (x[0], -x[1]))
        stack: list[list] = []  # [end, name, self]
        for start, end, name in spans:
            while stack and stack[-1][0] <= start:
                done = stack.pop()
                self_ns.append((done[1], done[2]))
            if stack:
                stack[-1][2] -= end - start
            stack.append([end, name, end - start])
        self_ns += [(name, own) for _, name, own in stack]
    result = empty_metrics() | {k: None for k in ("gpu_busy_pct", "gpu_idle_pct", "idle_gaps_per_step",
                                                   "kernel_time_pct", "memcpy_time_pct", "memset_time_pct",
                                                   "exposed_memcpy_pct", "um_migration_pct", "h2d_gb", "d2h_gb")}
    result.update({
        "window": {"start_ns": window[0] if window else 0, "end_ns": window[1] if window else 0,
                   "duration_ns": (window[1] - window[0]) if window else 0, "basis": "cpu steps",
                   "steps": [s.step for s in steady], "warmup_steps": [s.step for s in warm]},
        "top_kernels": top_by_name(self_ns),
        "phases_ms_per_step": phases(events, steady),
        "step_ms": step_times(steps, steady),
        "health": [],
    })
    return result


def phases(events: list[dict], steady: list[db.Step]) -> dict[str, float]:
    if not steady:
        return {}
    lo, hi = steady[0].start, steady[-1].end
    out = dict.fromkeys(PHASES, 0.0)
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"] in out:
            s, end = _ns(e)
            if lo <= s and end <= hi:
                out[e["name"]] += (end - s) / len(steady) / 1e6
    return out


def top_by_name(items: list[tuple[str, int]], limit: int = 5) -> list[dict]:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, ns in items:
        totals[name][0] += ns
        totals[name][1] += 1
    whole = sum(t for t, _ in totals.values())
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:limit]
    return [{"name": n, "short_name": n, "total_ns": t, "count": c, "mean_ns": t / c, "pct": pct(t, whole)}
            for n, (t, c) in ranked]


def _length(intervals: Intervals) -> int:
    return sum(e - s for s, e in zip(intervals.starts, intervals.ends))
