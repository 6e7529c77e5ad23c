"""Where the time of a profiled run went: one dict of numbers (the `--json` of
`python -m ghsweep.analyze`), from an nsys SQLite export, an .nsys-rep (exported first when nsys is
here) or a PyTorch-profiler Chrome trace, plus findings in words (findings.py).

Definitions (the same for every source):
- window: the steady-state steps (NVTX "step N" ranges, warm-up steps excluded), projected onto
  the GPU; the whole trace when there are no step ranges.
- gpu_busy_pct: union of kernel, memcpy and memset time on the device over the window (never a
  sum of per-stream times); gpu_idle_pct = 100 - busy.
- kernel/memcpy/memset_time_pct: shares of the summed durations of GPU operations (how nsys's
  timeline and the seed talk's "99.5% kernels vs 0.5% memory" count them).
- exposed_memcpy_pct: time a copy runs with no kernel running, over the window.
- um_migration_pct: unified-memory migrations' share of memory-operation time.
"""

from __future__ import annotations

import bisect
import gzip
import json
import statistics
from pathlib import Path

import numpy as np

from ghsweep.profile import nsys_db as db
from ghsweep.profile.capture import ProfilerUnavailable, export_sqlite, find_tool
from ghsweep.profile.timeline import KERNEL as KERNEL_OP, MEMCPY as MEMCPY_OP, MEMSET as MEMSET_OP, Ops, timeline

GAP_BUCKETS = ((0, 10_000, "<10us"), (10_000, 100_000, "10-100us"), (100_000, 1_000_000, "0.1-1ms"),
               (1_000_000, 10_000_000, "1-10ms"), (10_000_000, None, ">=10ms"))
# Gaps shorter than this are the normal spacing of back-to-back kernels, not idle periods.
IDLE_GAP_MIN_NS = 10_000
# short_gaps: gaps under IDLE_GAP_MIN_NS, the spacing of back-to-back work, not attributed one by one.
GAP_CAUSES = ("sync", "host_wait", "data_loading", "launch_latency", "unattributed", "short_gaps")
SYNC_CALLS = ("cudaDeviceSynchronize%", "cudaStreamSynchronize%", "cudaEventSynchronize%", "cudaMemcpy\\_%",
              "cudaMemcpy", "cuCtxSynchronize%", "cuStreamSynchronize%", "cuEventSynchronize%", "cuMemcpyDtoH\\_%",
              "cuMemcpyHtoD\\_%", "cudaStreamQuery%")
OS_WAITS = ("pthread_cond_wait%", "pthread_cond_timedwait%", "pthread_cond_clockwait%", "sem_wait%",
            "sem_timedwait%", "poll", "ppoll", "epoll_wait", "epoll_pwait", "select", "pselect%", "read", "pread%",
            "readv", "recv%", "nanosleep", "clock_nanosleep", "usleep", "futex%")
LAUNCH_CALLS = ("cudaLaunchKernel%", "cuLaunchKernel%", "cudaLaunchCooperativeKernel%", "cudaGraphLaunch%")
MEMCPY_KIND = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP", 11: "UM HtoD", 12: "UM DtoH", 13: "UM DtoD"}
UM_KINDS = (11, 12, 13)
MEM_KIND = {0: "pageable", 1: "pinned", 2: "device", 4: "managed", 7: "unknown"}
PHASES = ("data", "forward", "backward", "optimizer")
WHOLE_TRACE_KERNELS = 50


def analyze(path: Path, nsys_path: str | None = None) -> dict:
    """Analyse a profile file; the type is told by its name (.sqlite, .nsys-rep, .json[.gz])."""
    path = Path(path)
    name = path.name
    if name.endswith(".sqlite"):
        return analyze_nsys(path)
    if name.endswith(".nsys-rep"):
        nsys = find_tool("nsys", nsys_path)
        if nsys is None:
            raise ProfilerUnavailable(f"{path}: an .nsys-rep needs nsys to export it to SQLite and nsys is not on "
                                      "PATH; export it where nsys is (nsys export --type=sqlite) and pass the .sqlite")
        sqlite = path.with_suffix(".sqlite")
        if not sqlite.exists() or sqlite.stat().st_mtime < path.stat().st_mtime:
            export_sqlite(nsys, path)
        return analyze_nsys(sqlite)
    if name.endswith((".json", ".json.gz")):
        from ghsweep.profile.torch_trace import analyze_torch_trace

        return analyze_torch_trace(path)
    raise ValueError(f"{path}: not a profile this tool reads; accepted: .sqlite (nsys export), .nsys-rep, "
                     ".json or .json.gz (PyTorch profiler trace)")


def pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


def bucket_sums(gap_lengths: list[int]) -> list[tuple[int, int]]:
    """(count, total ns) of gaps per GAP_BUCKETS bucket (the SQL path computes these in SQLite)."""
    return [(sum(1 for g in gap_lengths if g >= lo and (hi is None or g < hi)),
             sum(g for g in gap_lengths if g >= lo and (hi is None or g < hi))) for lo, hi, _ in GAP_BUCKETS]


def gap_stats(buckets: list[tuple[int, int]], idle_gaps: list[int], max_ns: int, steps: int) -> dict:
    """Histogram of all gaps; count, quantiles and per-step rate of idle gaps (>= IDLE_GAP_MIN_NS)."""
    ordered = sorted(idle_gaps)

    def quantile(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0

    return {
        "count": sum(c for c, _ in buckets),
        "total_ns": sum(t for _, t in buckets),
        "max_ns": max_ns,
        "histogram": [{"bucket": label, "count": c, "total_ns": t} for (_, _, label), (c, t) in zip(GAP_BUCKETS, buckets)],
        "idle_gaps": len(ordered),
        "idle_gaps_per_step": len(ordered) / steps if steps else float(len(ordered)),
        "idle_p50_ns": quantile(0.5),
        "idle_p95_ns": quantile(0.95),
    }


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


def attribute_gaps(con, schema: db.Schema, gaps: list[tuple[int, int, int]], pid: int, window: tuple[int, int]
                   ) -> dict[str, int]:
    """Idle time per cause. For each idle gap, first match wins: a synchronising call in the process
    overlaps it; the thread that launched the work ending the gap was in an OS wait; a "data*"
    NVTX range overlaps it; that launch came after the gap began (the host was late); else
    unattributed. (Other threads' waits say nothing: an idle autograd or loader thread always waits.)
    """
    causes = dict.fromkeys(GAP_CAUSES, 0)
    if not gaps:
        return causes
    data = Intervals((s, e) for _, s, e in db.nvtx_intervals(con, schema, pid, "data%", window))
    sync, launched = Intervals([]), {}
    if schema.has(db.RUNTIME):
        calls = db.process_intervals(con, db.RUNTIME, pid, db.names_like(con, SYNC_CALLS), window)
        sync = Intervals((s, e) for _, s, e in calls)
        launched = db.launch_calls(con, pid, [c for _, _, c in gaps])
    waits: dict[int, Intervals] = {}
    if schema.has(db.OSRT):
        per_thread: dict[int, list] = {}
        for tid, s, e in db.process_intervals(con, db.OSRT, pid, db.names_like(con, OS_WAITS), window):
            per_thread.setdefault(tid, []).append((s, e))
        waits = {tid: Intervals(spans) for tid, spans in per_thread.items()}
    no_waits = Intervals([])
    for start, end, corr in gaps:
        launch_start, launch_tid = launched.get(corr, (start, None))
        if sync.overlaps(start, end):
            cause = "sync"
        elif waits.get(launch_tid, no_waits).overlaps(start, end):
            cause = "host_wait"
        elif data.overlaps(start, end):
            cause = "data_loading"
        elif launch_start > start:
            cause = "launch_latency"
        else:
            cause = "unattributed"
        causes[cause] += end - start
    return causes


def memory_ops(groups: list[tuple]) -> dict:
    """Per direction and host memory kind: count, bytes, time, bandwidth; pageable and UM totals."""
    rows, by_kind = [], {}
    big_pageable = {"count": 0, "bytes": 0}
    for kind, src, dst, count, ns, nbytes, big_n, big_b in groups:
        label = MEMCPY_KIND.get(kind, f"kind {kind}")
        rows.append({
            "kind": label, "src": MEM_KIND.get(src, str(src)), "dst": MEM_KIND.get(dst, str(dst)), "count": count,
            "bytes": nbytes, "total_ns": ns, "gb_per_s": nbytes / ns if ns else 0.0,
        })
        entry = by_kind.setdefault(label, {"count": 0, "bytes": 0, "total_ns": 0})
        entry["count"] += count
        entry["bytes"] += nbytes
        entry["total_ns"] += ns
        if 0 in (src, dst) and kind not in UM_KINDS:
            big_pageable["count"] += big_n or 0
            big_pageable["bytes"] += big_b or 0
    return {"copies": sorted(rows, key=lambda r: -r["total_ns"]), "by_kind": by_kind, "pageable_big": big_pageable}


def analyze_nsys(path: Path) -> dict:
    con = db.open_readonly(path)
    try:
        return _analyze_nsys(con, path)
    finally:
        con.close()


def _analyze_nsys(con, path: Path) -> dict:
    schema = db.Schema.read(con)
    info = db.meta(con, schema)
    health: list[str] = []
    traced = set(info.get("traced", []))
    if "OSRuntime" in traced and not schema.has(db.OSRT):
        health.append("OS runtime tracing was on but the export has no OSRT_API table")
    if not schema.has(db.KERNEL):
        health.append("the export has no CUDA kernels (was CUDA traced, and did the capture range see any work?)")
    kernels = db.read_table(con, schema, db.KERNEL, db.kernel_columns(con, schema))
    copies = db.read_table(con, schema, db.MEMCPY, db.GPU_COLUMNS)
    sets = db.read_table(con, schema, db.MEMSET, db.GPU_COLUMNS)
    pid, device = db.main_process_device(kernels)
    steps = db.step_ranges(con, schema)
    warm, steady = db.split_warmup(steps)
    gpu = [(kernels, KERNEL_OP), (copies, MEMCPY_OP), (sets, MEMSET_OP)]

    window = db.gpu_window(con, schema, [t for t, _ in gpu], steady, pid, device) if pid is not None else None
    basis = "nvtx steps"
    ops = Ops.concat([Ops(t["start"][m], t["end"][m], np.full(int(m.sum()), kind), t["corr"][m])
                      for t, kind in gpu for m in [(t["pid"] == pid) & (t["dev"] == device)]])
    if window is None and pid is not None:
        basis = "whole trace"
        if not steps:
            health.append('no NVTX "step N" ranges: the window is the whole trace, warm-up included')
        window = (int(ops.start.min()), int(ops.end.max())) if len(ops.start) else None

    result: dict = {
        "source": {"path": str(path), "kind": "nsys", **info},
        "window": {"start_ns": window[0] if window else 0, "end_ns": window[1] if window else 0,
                   "steps": [s.step for s in steady] if basis == "nvtx steps" else [],
                   "warmup_steps": [s.step for s in warm], "basis": basis},
        "whole_trace": whole_trace(con, schema, kernels),
    }
    if window is None:
        health.append("no GPU activity in the main process: nothing to analyse")
        result.update(empty_metrics())
        result["health"] = health
        return result

    span = window[1] - window[0]
    n_steps = len(steady) if basis == "nvtx steps" else 0
    params = {"w0": window[0], "w1": window[1], "pid": pid, "dev": device}
    line = timeline(ops.clip(*window), [(lo, hi) for lo, hi, _ in GAP_BUCKETS], IDLE_GAP_MIN_NS)
    causes = attribute_gaps(con, schema, line.long_gaps, pid, window)
    gap_info = gap_stats(line.gap_buckets, [e - s for s, e, _ in line.long_gaps], line.gap_max_ns, n_steps)
    causes["short_gaps"] = gap_info["total_ns"] - sum(causes.values())
    gap_info["causes_ns"] = causes

    inside = (kernels["pid"] == pid) & (kernels["dev"] == device) & (kernels["start"] >= window[0]) \
        & (kernels["end"] <= window[1])
    groups = db.kernel_groups(con, kernels, inside)
    k_n, k_ns = groups["count"], groups["total_ns"]
    c_n, c_ns, c_b = db.sums(con, db.MEMCPY, params) if schema.has(db.MEMCPY) else (0, 0, 0)
    s_n, s_ns, s_b = db.sums(con, db.MEMSET, params) if schema.has(db.MEMSET) else (0, 0, 0)
    mem = memory_ops(db.memcpy_groups(con, params)) if schema.has(db.MEMCPY) else memory_ops([])
    um_ns = sum(v["total_ns"] for k, v in mem["by_kind"].items() if k.startswith("UM"))
    um_bytes = sum(v["bytes"] for k, v in mem["by_kind"].items() if k.startswith("UM"))
    ops_ns = k_ns + c_ns + s_ns
    launch_ns = db.call_time(con, db.RUNTIME, pid, db.names_like(con, LAUNCH_CALLS), window) \
        if schema.has(db.RUNTIME) else 0
    phases = {}
    if steady and basis == "nvtx steps":
        cpu_window = (steady[0].start, steady[-1].end)
        for name in PHASES:
            spans = db.nvtx_intervals(con, schema, pid, name, cpu_window)
            phases[name] = sum(e - s for _, s, e in spans) / len(steady) / 1e6
    h2d = sum(v["bytes"] for k, v in mem["by_kind"].items() if k in ("HtoD", "UM HtoD"))
    d2h = sum(v["bytes"] for k, v in mem["by_kind"].items() if k in ("DtoH", "UM DtoH"))

    result.update({
        "gpu_busy_pct": pct(line.busy_ns, span),
        "gpu_idle_pct": 100.0 - pct(line.busy_ns, span),
        "idle_gaps_per_step": gap_info["idle_gaps_per_step"],
        "kernel_time_pct": pct(k_ns, ops_ns),
        "memcpy_time_pct": pct(c_ns, ops_ns),
        "memset_time_pct": pct(s_ns, ops_ns),
        "exposed_memcpy_pct": pct(line.kernel_or_copy_ns - line.kernel_union_ns, span),
        "um_migration_pct": pct(um_ns, c_ns + s_ns),
        "um_migration_bytes_pct": pct(um_bytes, c_b + s_b),
        "h2d_gb": h2d / 1e9,
        "d2h_gb": d2h / 1e9,
        "top_kernels": groups["ranked"][:5],
        "kernels": {"count": k_n, "total_ns": k_ns, "short_pct": pct(groups["short"], k_n),
                    "launch_api_ns": launch_ns},
        "memcpy": {"count": c_n, "total_ns": c_ns, "bytes": c_b, **mem},
        "memset": {"count": s_n, "total_ns": s_ns, "bytes": s_b},
        "page_faults": db.page_faults(con, schema),
        "gaps": gap_info,
        "phases_ms_per_step": phases,
        "step_ms": step_times(steps, steady),
        "health": health,
    })
    result["window"]["duration_ns"] = span
    return result


def step_times(steps: list[db.Step], steady: list[db.Step]) -> dict:
    if not steady:
        return {}
    return {"median": statistics.median(s.duration for s in steady) / 1e6,
            "first": steps[0].duration / 1e6, "all": [round(s.duration / 1e6, 3) for s in steps]}


def whole_trace(con, schema: db.Schema, kernel_table: db.Table) -> dict:
    """Whole-trace totals computed the way `nsys stats` reports them (the cross-check)."""
    kernels = db.kernel_groups(con, kernel_table, None)
    out: dict = {"kernels": kernels["ranked"][:WHOLE_TRACE_KERNELS], "distinct_kernels": len(kernels["ranked"]),
                 "kernel_count": kernels["count"], "kernel_total_ns": kernels["total_ns"]}
    ops = {}
    if schema.has(db.MEMCPY):
        for kind, count, ns, nbytes in con.execute(
                f"SELECT copyKind, COUNT(*), SUM(end - start), SUM(bytes) FROM {db.MEMCPY} GROUP BY copyKind"):
            ops[MEMCPY_KIND.get(kind, f"kind {kind}")] = {"count": count, "total_ns": ns, "bytes": nbytes}
    if schema.has(db.MEMSET):
        count, ns, nbytes = db.sums(con, db.MEMSET, None)
        if count:
            ops["memset"] = {"count": count, "total_ns": ns, "bytes": nbytes}
    out["memory_ops"] = ops
    return out


def empty_metrics() -> dict:
    return {k: 0.0 for k in ("gpu_busy_pct", "gpu_idle_pct", "idle_gaps_per_step", "kernel_time_pct",
                             "memcpy_time_pct", "memset_time_pct", "exposed_memcpy_pct", "um_migration_pct",
                             "h2d_gb", "d2h_gb")} | {"top_kernels": []}


def load_json(path: Path):
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)
