"""Where the time of a profiled run went: one dict of numbers (the `--json` of
`python -m ghsweep.analyze`), from an nsys SQLite export, an .nsys-rep (exported first when nsys is
here) or a PyTorch-profiler Chrome trace, plus findings in words (findings.py).

Definitions (the same for every source):
- window: the steady-state steps, projected onto the GPU (steps.py: named ranges of the common
  conventions, else steps inferred from the repeating GPU work; slow leading warm-up steps
  excluded); the whole trace only when neither exists, and then every statement says so.
- gpu_busy_pct: union of kernel, memcpy and memset time on the device over the window (never a
  sum of per-stream times); gpu_idle_pct = 100 - busy.
- kernel/memcpy/memset_time_pct: shares of the summed durations of GPU operations (how nsys's
  timeline and the seed talk's "99.5% kernels vs 0.5% memory" count them).
- exposed_memcpy_pct: time a copy runs with no kernel running, over the window.
- um_migration_pct: unified-memory migrations' share of memory-operation time.
- nccl_time_pct / exposed_nccl_pct (runs on several GPUs): NCCL kernels' share of kernel time, and
  the time NCCL kernels run with no compute kernel on the device, over the window.
"""

from __future__ import annotations

import bisect
import gzip
import json
import sqlite3
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ghsweep.profile import kernel_kinds, steps as step_finder
from ghsweep.profile import nsys_db as db
from ghsweep.profile.capture import export_sqlite, find_tool
from ghsweep.profile.timeline import KERNEL as KERNEL_OP, MEMCPY as MEMCPY_OP, MEMSET as MEMSET_OP, Ops, timeline, union_ns
from ghsweep.core.errors import ProfileError, ProfilerUnavailable, first_line

GAP_BUCKETS = ((0, 10_000, "<10us"), (10_000, 100_000, "10-100us"), (100_000, 1_000_000, "0.1-1ms"),
               (1_000_000, 10_000_000, "1-10ms"), (10_000_000, None, ">=10ms"))
# Gaps shorter than this are the normal spacing of back-to-back kernels, not idle periods.
IDLE_GAP_MIN_NS = 10_000
# short_gaps: gaps under IDLE_GAP_MIN_NS, the spacing of back-to-back work, not attributed one by one.
# In the order attribute() tries them (first match wins).
GAP_CAUSES = ("sync", "host_wait", "unified_memory", "data_loading", "launch_latency", "unattributed", "short_gaps")
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
PHASE_LIKE = tuple(f"{p}%" for p in PHASES)
WHOLE_TRACE_KERNELS = 50


def analyze(path: Path, nsys_path: str | None = None) -> dict:
    """Analyse a profile file; the type is told by its name (.sqlite, .nsys-rep, .json[.gz]).
    ProfileError (or ProfilerUnavailable for an .nsys-rep without nsys) when it cannot be."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
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
    raise ProfileError(f"{path}: not a profile this tool reads; accepted: .sqlite (nsys export), .nsys-rep, "
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


@dataclass
class GapEvidence:
    """What the host was doing while the GPU idled, as interval sets (host times, ns)."""
    sync: Intervals = field(default_factory=lambda: Intervals([]))  # synchronising calls, blocking copies
    waits: dict[int, Intervals] = field(default_factory=dict)  # OS waits, per thread
    unified_memory: Intervals = field(default_factory=lambda: Intervals([]))  # phases with UM faults/migrations
    data: Intervals = field(default_factory=lambda: Intervals([]))  # "data*" ranges
    launches: dict[int, tuple[int, int | None]] = field(default_factory=dict)  # correlation -> (launch, thread)

    def cause(self, start: int, end: int, corr: int) -> str:
        """The cause of the idle gap (start, end) ended by the operation launched as `corr`; the
        first match of GAP_CAUSES' order wins (findings.py writes the order down)."""
        launch_start, launch_tid = self.launches.get(corr, (start, None))
        if self.sync.overlaps(start, end):
            return "sync"
        if launch_tid in self.waits and self.waits[launch_tid].overlaps(start, end):
            return "host_wait"
        if self.unified_memory.overlaps(start, end):
            return "unified_memory"
        if self.data.overlaps(start, end):
            return "data_loading"
        if launch_start > start:
            return "launch_latency"
        return "unattributed"

    def attribute(self, gaps: list[tuple[int, int, int]]) -> dict[str, int]:
        """Idle time per cause of the idle gaps (start, end, correlation id of the op ending it)."""
        causes = dict.fromkeys(GAP_CAUSES, 0)
        for start, end, corr in gaps:
            causes[self.cause(start, end, corr)] += end - start
        return causes


def um_phase_ranges(phases: list[tuple[int, int]], faults: np.ndarray, migrations: Intervals) -> Intervals:
    """The phase ranges that contain a unified-memory CPU page fault or overlap a UM migration: the
    host's time there goes to unified memory, whatever the phase is called."""
    faults = np.sort(faults)
    hit = [(s, e) for s, e in phases
           if np.searchsorted(faults, s) < np.searchsorted(faults, e, side="right") or migrations.overlaps(s, e)]
    return Intervals(hit + [(int(t), int(t) + 1) for t in faults])


def nsys_gap_evidence(con, schema: db.Schema, gaps: list[tuple[int, int, int]], pid: int, device: int,
                      window: tuple[int, int]) -> GapEvidence:
    """Evidence from the export: synchronising calls of the process; OS waits of the thread that
    launched the work ending a gap (other threads' waits say nothing: an idle autograd or loader
    thread always waits); phase ranges with unified-memory faults or migrations; "data*" ranges."""
    evidence = GapEvidence(data=Intervals((s, e) for _, s, e in db.nvtx_intervals(con, schema, pid, "data%", window)))
    if not gaps:
        return evidence
    if schema.has(db.RUNTIME):
        calls = db.process_intervals(con, db.RUNTIME, pid, db.names_like(con, SYNC_CALLS), window)
        evidence.sync = Intervals((s, e) for _, s, e in calls)
        evidence.launches = db.launch_calls(con, pid, [c for _, _, c in gaps])
    if schema.has(db.OSRT):
        per_thread: dict[int, list] = {}
        for tid, s, e in db.process_intervals(con, db.OSRT, pid, db.names_like(con, OS_WAITS), window):
            per_thread.setdefault(tid, []).append((s, e))
        evidence.waits = {tid: Intervals(spans) for tid, spans in per_thread.items()}
    faults = db.cpu_page_faults(con, schema, pid, window)
    migrations = Intervals(con.execute(
        f"SELECT start, end FROM {db.MEMCPY} WHERE globalPid = ? AND deviceId = ? AND copyKind IN {UM_KINDS} "
        "AND end > ? AND start < ?", (pid, device, *window)).fetchall()) if schema.has(db.MEMCPY) else Intervals([])
    if len(faults) or migrations.starts:
        phases = [(s, e) for like in PHASE_LIKE for _, s, e in db.nvtx_intervals(con, schema, pid, like, window)]
        evidence.unified_memory = um_phase_ranges(phases, faults, migrations)
    return evidence


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


# Columns a GPU table must have to be analysed (the analysis reads no other).
REQUIRED_COLUMNS = {db.KERNEL: ("start", "end", "deviceId", "globalPid", "correlationId"),
                    db.MEMCPY: ("start", "end", "deviceId", "globalPid", "correlationId", "bytes", "copyKind",
                                "srcKind", "dstKind"),
                    db.MEMSET: ("start", "end", "deviceId", "globalPid", "correlationId", "bytes")}
TIME_MAPPED = ("no CUDA runtime API calls with correlation ids: the steps were mapped onto the GPU by time, not "
               "through their launches (the GPU's lag behind the host shifts the window)")
NO_STEPS = ('no step ranges (NVTX ranges named like "step N", "iteration N", "train_step", "ProfilerStep#N") '
            "and no repeating GPU work that marks steps (optimizer-kernel bursts, a kernel recurring at a fixed period)")


def analyze_nsys(path: Path) -> dict:
    try:
        con = db.open_readonly(path)
        try:
            return _analyze_nsys(con, path)
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise ProfileError(f"{path}: not a readable nsys SQLite export ({first_line(exc)})") from None


def check_export(con, schema: db.Schema, path: Path) -> None:
    """ProfileError unless the export has GPU activity this analysis can read."""
    if not schema.tables:
        raise ProfileError(f"{path}: not an nsys SQLite export: it has no tables (an empty or truncated file?)")
    present = [t for t in REQUIRED_COLUMNS if schema.has(t)]
    if not present:
        raise ProfileError(f"{path}: no GPU activity: the export has no kernel, memcpy or memset table (was CUDA "
                           "traced, --trace=cuda, and did the capture range run any GPU work?)")
    for table in present:
        missing = [c for c in REQUIRED_COLUMNS[table] if not schema.has(table, con, c)]
        if missing:
            raise ProfileError(f"{path}: table {table} lacks the columns {', '.join(missing)}: not an nsys export "
                               "this tool reads (nsys export --type=sqlite writes them)")
    if schema.has(db.KERNEL) and not schema.has("StringIds"):
        raise ProfileError(f"{path}: no StringIds table, so kernel names cannot be read: an incomplete export "
                           "(export the .nsys-rep again with nsys export --type=sqlite)")
    if schema.has(db.KERNEL) and not (schema.has(db.KERNEL, con, "demangledName")
                                      or schema.has(db.KERNEL, con, "shortName")):
        raise ProfileError(f"{path}: table {db.KERNEL} has no kernel name column (demangledName, shortName)")


def find_steps(con, schema: db.Schema, kernels: db.Table, pid: int, device: int) -> step_finder.Steps | None:
    """The steps of the main process: NVTX ranges of a step convention, else inferred from its
    kernels (steps.py), else None."""
    found = step_finder.from_ranges(db.step_candidates(con, schema, pid), "NVTX ranges")
    if found is not None:
        return found
    mine = kernels.where((kernels["pid"] == pid) & (kernels["dev"] == device))
    order = np.argsort(mine["start"], kind="stable")
    ids = mine["name"][order]
    names = db.string_values(con, np.unique(ids).tolist())
    return infer_steps(mine["start"][order], mine["end"][order], ids, names)


def infer_steps(start: np.ndarray, end: np.ndarray, keys: np.ndarray, names: dict[int, str]
                ) -> step_finder.Steps | None:
    """Steps from kernels sorted by start, keyed by name (`names`: key -> kernel name): optimizer
    bursts, else the period of the kernel sequence."""
    optimizer = sorted(k for k, n in names.items() if kernel_kinds.is_optimizer(n))
    what = ", ".join(sorted({kernel_kinds.function_name(names[k]) for k in optimizer}))[:120]
    found = step_finder.from_optimizer_bursts(start, end, np.isin(keys, optimizer), what)
    if found is None:
        found = step_finder.from_repeats(start, end, keys, {k: kernel_kinds.function_name(n) for k, n in names.items()})
    return found


def steady_window(found: step_finder.Steps | None, health: list[str],
                  project: Callable[[list[step_finder.Step]], tuple[tuple[int, int] | None, bool]], no_gpu_work: str,
                  ) -> tuple[step_finder.Steps, tuple[int, int] | None]:
    """The steps and the GPU time window of their steady state; None: the whole trace (health says why).

    NVTX steps are CPU ranges: `project` maps them onto the GPU work they launched and says whether
    it could do so through correlation ids (else by time). Inferred steps are GPU time already.
    """
    if found is None:
        return whole_trace_steps(health, NO_STEPS), None
    if found.basis != step_finder.NVTX_BASIS:
        return found, (found.steady[0].start, found.steady[-1].end)
    window, projected = project(found.steady)
    if window is None:
        return whole_trace_steps(health, f"the steps ({found.source}) {no_gpu_work}"), None
    if not projected:
        health.append(TIME_MAPPED)
    return found, window


def whole_trace_steps(health: list[str], why: str) -> step_finder.Steps:
    health.append(f"{why}: the window is the whole trace, start-up and warm-up included")
    return step_finder.Steps()


def _analyze_nsys(con, path: Path) -> dict:
    schema = db.Schema.read(con)
    check_export(con, schema, path)
    info = db.meta(con, schema)
    health: list[str] = []
    traced = set(info.get("traced", []))
    if "OSRuntime" in traced and not schema.has(db.OSRT):
        health.append("OS runtime tracing was on but the export has no OSRT_API table")
    kernels = db.read_table(con, schema, db.KERNEL, db.kernel_columns(con, schema))
    if not len(kernels):
        health.append("the export has no CUDA kernels, only copies or memsets (did the capture range see the "
                      "training's work?)")
    copies = db.read_table(con, schema, db.MEMCPY, db.GPU_COLUMNS)
    sets = db.read_table(con, schema, db.MEMSET, db.GPU_COLUMNS)
    gpu = [(kernels, KERNEL_OP), (copies, MEMCPY_OP), (sets, MEMSET_OP)]
    pid, device = db.main_process_device([t for t, _ in gpu])
    if pid is None:
        raise ProfileError(f"{path}: no GPU activity: the export has no kernels, copies or memsets (did the capture "
                           "range run any GPU work?)")
    ops = Ops.concat([Ops(t["start"][m], t["end"][m], np.full(int(m.sum()), kind), t["corr"][m])
                      for t, kind in gpu for m in [(t["pid"] == pid) & (t["dev"] == device)]])

    found = find_steps(con, schema, kernels, pid, device)
    found, window = steady_window(
        found, health, lambda steady: db.gpu_window(con, schema, [t for t, _ in gpu], steady, pid, device),
        "launched no GPU work of the main process")
    if window is None:
        window = (int(ops.start.min()), int(ops.end.max()))

    span = window[1] - window[0]
    n_steps = len(found.steady)
    params = {"w0": window[0], "w1": window[1], "pid": pid, "dev": device}
    line = timeline(ops.clip(*window), [(lo, hi) for lo, hi, _ in GAP_BUCKETS], IDLE_GAP_MIN_NS)
    causes = nsys_gap_evidence(con, schema, line.long_gaps, pid, device, window).attribute(line.long_gaps)
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
    launch_ns = db.call_time(con, db.RUNTIME, pid, db.names_like(con, LAUNCH_CALLS), window) \
        if schema.has(db.RUNTIME) else 0
    phases = {}
    if found.basis == step_finder.NVTX_BASIS:
        cpu_window = (found.steady[0].start, found.steady[-1].end)
        for name in PHASES:
            spans = db.nvtx_intervals(con, schema, pid, name, cpu_window)
            phases[name] = sum(e - s for _, s, e in spans) / n_steps / 1e6
    communication = nccl_communication(kernels.where(inside), db.names_like(con, ("%nccl%",)), span, n_steps)
    top = groups["ranked"][:5]
    configs = db.launch_configs(con, schema, db.kernel_name_column(con, schema, "demangledName"), [k["name"] for k in top], params)
    for k in top:
        k["launch_configs"] = configs.get(k["name"])

    result = {
        "source": {"path": str(path), "kind": "nsys", **info},
        "window": window_block(window, found),
        "whole_trace": whole_trace(con, schema, kernels),
        **device_metrics(line.busy_ns, span, gap_info, k_ns, c_ns, s_ns, line.kernel_or_copy_ns - line.kernel_union_ns,
                         mem),
        "um_migration_bytes_pct": pct(sum(v["bytes"] for k, v in mem["by_kind"].items() if k.startswith("UM")),
                                      c_b + s_b),
        "top_kernels": top,
        "kernels": {"count": k_n, "total_ns": k_ns, "short_pct": pct(groups["short"], k_n), "launch_api_ns": launch_ns,
                    **kernel_kinds.gemm_time(groups["ranked"])},
        "memcpy": {"count": c_n, "total_ns": c_ns, "bytes": c_b, **mem},
        "memset": {"count": s_n, "total_ns": s_ns, "bytes": s_b},
        "page_faults": db.page_faults(con, schema),
        "gaps": gap_info,
        "communication": communication,
        "nccl_time_pct": communication.get("nccl_time_pct"),
        "exposed_nccl_pct": communication.get("exposed_nccl_pct"),
        "phases_ms_per_step": phases,
        "step_ms": step_times(found),
        "health": health,
    }
    return result


def nccl_communication(kernels: db.Table, nccl_names: list[int], span: int, steps: int) -> dict:
    """Communication on the device in the window: NCCL kernels' share of kernel time, and exposed
    communication, the time NCCL kernels run while no compute kernel does (what the step waits for).
    A collective's kernel runs from the moment its rank launches it until every rank has joined, so
    NCCL time per step includes waiting for the slowest rank: across ranks, it tells who waits and
    who is waited for. {} without NCCL kernels (a run on one GPU)."""
    comm = np.isin(kernels["name"], nccl_names)
    if not comm.any():
        return {}
    order = np.argsort(kernels["start"], kind="stable")
    start, end, comm = kernels["start"][order], kernels["end"][order], comm[order]
    compute_ns = union_ns(start[~comm], end[~comm])
    exposed_ns = union_ns(start, end) - compute_ns
    durations = end - start
    return {
        "nccl_ns": int(durations[comm].sum()),
        "nccl_kernels": int(comm.sum()),
        "nccl_time_pct": pct(int(durations[comm].sum()), int(durations.sum())),
        "exposed_nccl_ns": int(exposed_ns),
        "exposed_nccl_pct": pct(exposed_ns, span),
        "nccl_ms_per_step": int(durations[comm].sum()) / max(steps, 1) / 1e6,
        "compute_ms_per_step": compute_ns / max(steps, 1) / 1e6,
    }


def window_block(window: tuple[int, int], found: step_finder.Steps) -> dict:
    return {"start_ns": window[0], "end_ns": window[1], "duration_ns": window[1] - window[0], "basis": found.basis,
            "source": found.source, "steps": [s.step for s in found.steady],
            "warmup_steps": [s.step for s in found.warmup], "warmup_reason": found.warmup_reason}


def device_metrics(busy_ns: int, span: int, gap_info: dict, kernel_ns: int, copy_ns: int, set_ns: int,
                   exposed_ns: int, mem: dict) -> dict:
    """The metrics of METRICS (plan.py), the same for both sources."""
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


def step_times(found: step_finder.Steps) -> dict:
    if not found.steady:
        return {}
    return {"median": statistics.median(s.duration for s in found.steady) / 1e6,
            "first": found.all[0].duration / 1e6, "all": [round(s.duration / 1e6, 3) for s in found.all]}


def whole_trace(con, schema: db.Schema, kernel_table: db.Table) -> dict:
    """Whole-trace totals computed the way `nsys stats` reports them (the cross-check)."""
    ops = {}
    if schema.has(db.MEMCPY):
        for kind, count, ns, nbytes in con.execute(
                f"SELECT copyKind, COUNT(*), SUM(end - start), SUM(bytes) FROM {db.MEMCPY} GROUP BY copyKind"):
            ops[MEMCPY_KIND.get(kind, f"kind {kind}")] = {"count": count, "total_ns": ns, "bytes": nbytes}
    if schema.has(db.MEMSET):
        count, ns, nbytes = db.sums(con, db.MEMSET, None)
        if count:
            ops["memset"] = {"count": count, "total_ns": ns, "bytes": nbytes}
    return whole_trace_block(db.kernel_groups(con, kernel_table, None), ops)


def whole_trace_block(kernels: dict, memory_ops: dict) -> dict:
    """kernels: {ranked, count, total_ns} of every kernel; memory_ops: {kind: {count, total_ns, bytes}}."""
    return {"kernels": kernels["ranked"][:WHOLE_TRACE_KERNELS], "distinct_kernels": len(kernels["ranked"]),
            "kernel_count": kernels["count"], "kernel_total_ns": kernels["total_ns"], "memory_ops": memory_ops}


def load_json(path: Path):
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path}: not a readable JSON trace ({first_line(exc)})") from None
