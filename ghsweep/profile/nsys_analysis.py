"""The nsys reader of the analysis: an Nsight Systems SQLite export's device operations, steps
and host evidence, handed to the shared engine (engine.py), plus what only nsys records
(page faults, launch configurations, NCCL kernels, the whole-trace cross-check)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ghsweep.core.errors import ProfileError, first_line
from ghsweep.core.names import PHASES
from ghsweep.profile import kernel_kinds
from ghsweep.profile import nsys_db as db
from ghsweep.profile import steps as step_finder
from ghsweep.profile.engine import (
    MEMCPY_KIND,
    PEER_COPY_KIND,
    UM_KINDS,
    GapEvidence,
    Intervals,
    device_metrics,
    event_health,
    gap_block,
    infer_steps,
    memory_ops,
    pct,
    steady_window,
    step_times,
    time_per_step,
    whole_trace_block,
    window_block,
    window_timeline,
)
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.profile.timeline import KERNEL as KERNEL_OP
from ghsweep.profile.timeline import MEMCPY as MEMCPY_OP
from ghsweep.profile.timeline import MEMSET as MEMSET_OP
from ghsweep.profile.timeline import Ops, union_ns

SYNC_CALLS = (
    "cudaDeviceSynchronize%",
    "cudaStreamSynchronize%",
    "cudaEventSynchronize%",
    "cudaMemcpy\\_%",
    "cudaMemcpy",
    "cudaMemcpy2D\\_%",
    "cudaMemcpy2D",
    "cuCtxSynchronize%",
    "cuStreamSynchronize%",
    "cuEventSynchronize%",
    "cuMemcpyDtoH\\_%",
    "cuMemcpyHtoD\\_%",
    "cudaStreamQuery%",
)
OS_WAITS = (
    "pthread_cond_wait%",
    "pthread_cond_timedwait%",
    "pthread_cond_clockwait%",
    "sem_wait%",
    "sem_timedwait%",
    "poll",
    "ppoll",
    "epoll_wait",
    "epoll_pwait",
    "select",
    "pselect%",
    "read",
    "pread%",
    "readv",
    "recv%",
    "nanosleep",
    "clock_nanosleep",
    "usleep",
    "futex%",
)
LAUNCH_CALLS = ("cudaLaunchKernel%", "cuLaunchKernel%", "cudaLaunchCooperativeKernel%", "cudaGraphLaunch%")
# User ranges "data*" and PyTorch's own DataLoader ranges (with autograd NVTX emission on):
# "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "DataLoader.__next__", ...
DATA_LIKE = ("data%", "%DataLoader%")
# The call that starts a capture range, runtime's or driver's (the worker's torch.cuda.profiler.start).
PROFILER_START = ("cudaProfilerStart%", "cuProfilerStart%")
EVERYWHERE = (-(2**62), 2**62)  # a window around every timestamp (an export's may be negative)
PHASE_LIKE = tuple(f"{p}%" for p in PHASES)
# Columns a GPU table must have to be analysed (the analysis reads no other).
REQUIRED_COLUMNS = {
    db.KERNEL: ("start", "end", "deviceId", "globalPid", "correlationId"),
    db.MEMCPY: ("start", "end", "deviceId", "globalPid", "correlationId", "bytes", "copyKind", "srcKind", "dstKind"),
    db.MEMSET: ("start", "end", "deviceId", "globalPid", "correlationId", "bytes"),
}


def analyze_nsys(path: Path) -> ProfileAnalysis:
    try:
        con = db.open_readonly(path)
        try:
            return ProfileAnalysis(**_analyze_nsys(con, path))
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
        raise ProfileError(
            f"{path}: no GPU activity: the export has no kernel, memcpy or memset table (was CUDA "
            "traced, --trace=cuda, and did the capture range run any GPU work?)"
        )
    for table in present:
        missing = [c for c in REQUIRED_COLUMNS[table] if not schema.has(table, con, c)]
        if missing:
            raise ProfileError(
                f"{path}: table {table} lacks the columns {', '.join(missing)}: not an nsys export "
                "this tool reads (nsys export --type=sqlite writes them)"
            )
    if schema.has(db.KERNEL) and not schema.has("StringIds"):
        raise ProfileError(
            f"{path}: no StringIds table, so kernel names cannot be read: an incomplete export "
            "(export the .nsys-rep again with nsys export --type=sqlite)"
        )
    if schema.has(db.KERNEL) and not (
        schema.has(db.KERNEL, con, "demangledName") or schema.has(db.KERNEL, con, "shortName")
    ):
        raise ProfileError(f"{path}: table {db.KERNEL} has no kernel name column (demangledName, shortName)")


def find_steps(con, schema: db.Schema, kernels: db.Table, pid: int, device: int) -> step_finder.Steps | None:
    """The steps of the main process: NVTX ranges of a step convention, else inferred from its
    kernels (steps.py), else None."""
    found = step_finder.from_ranges(db.step_candidates(con, schema, pid), "NVTX ranges")
    if found is not None:
        started = capture_started_at(con, schema, pid)
        if started is not None and found.all[0].start >= started:
            return step_finder.Steps(found.all, found.basis, found.source, capture_start=True)
        return found
    mine = kernels.where((kernels["pid"] == pid) & (kernels["dev"] == device))
    order = np.argsort(mine["start"], kind="stable")
    ids = mine["name"][order]
    names = db.string_values(con, np.unique(ids).tolist())
    return infer_steps(mine["start"][order], mine["end"][order], ids, names)


def capture_started_at(con, schema: db.Schema, pid: int) -> int | None:
    """When process `pid` started the capture range (cudaProfilerStart), where it did: nsys records
    from that call on (--capture-range=cudaProfilerApi, how ghsweep's worker captures its window)."""
    if not schema.has(db.RUNTIME):
        return None
    calls = db.process_intervals(con, db.RUNTIME, pid, db.names_like(con, PROFILER_START), EVERYWHERE)
    return calls[0][1] if calls else None


def um_phase_ranges(phases: list[tuple[int, int]], faults: np.ndarray, migrations: Intervals) -> Intervals:
    """The phase ranges that contain a unified-memory CPU page fault or overlap a UM migration: the
    host's time there goes to unified memory, whatever the phase is called."""
    faults = np.sort(faults)
    hit = [
        (s, e)
        for s, e in phases
        if np.searchsorted(faults, s) < np.searchsorted(faults, e, side="right") or migrations.overlaps(s, e)
    ]
    return Intervals(hit + [(int(t), int(t) + 1) for t in faults])


def nsys_gap_evidence(
    con, schema: db.Schema, gaps: list[tuple[int, int, int]], pid: int, device: int, window: tuple[int, int]
) -> GapEvidence:
    """Evidence from the export: synchronising calls of the process; OS waits of the thread that
    launched the work ending a gap (other threads' waits say nothing: an idle autograd or loader
    thread always waits); phase ranges with unified-memory faults or migrations; "data*" ranges."""
    evidence = GapEvidence(
        data=Intervals((s, e) for like in DATA_LIKE for _, s, e in db.nvtx_intervals(con, schema, pid, like, window)),
        os_waits_traced=schema.has(db.OSRT),
    )
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
    migrations = (
        Intervals(
            con.execute(
                f"SELECT start, end FROM {db.MEMCPY} WHERE globalPid = ? AND deviceId = ? AND copyKind IN {UM_KINDS} "
                "AND end > ? AND start < ?",
                (pid, device, *window),
            ).fetchall()
        )
        if schema.has(db.MEMCPY)
        else Intervals([])
    )
    if len(faults) or migrations.starts:
        phases = [(s, e) for like in PHASE_LIKE for _, s, e in db.nvtx_intervals(con, schema, pid, like, window)]
        evidence.unified_memory = um_phase_ranges(phases, faults, migrations)
    return evidence


@dataclass
class DeviceOps:
    """The export's GPU tables and the main process's operations on its device."""

    kernels: db.Table
    tables: list[db.Table]  # kernels, copies, memsets
    pid: int
    device: int
    ops: Ops


def read_device_ops(con, schema: db.Schema, path: Path, health: list[str]) -> DeviceOps:
    kernels = db.read_table(con, schema, db.KERNEL, db.kernel_columns(con, schema))
    if not len(kernels):
        health.append(
            "the export has no CUDA kernels, only copies or memsets (did the capture range see the training's work?)"
        )
    copies = db.read_table(con, schema, db.MEMCPY, {**db.GPU_COLUMNS, "copy_kind": "copyKind"})
    sets = db.read_table(con, schema, db.MEMSET, db.GPU_COLUMNS)
    gpu = [(kernels, KERNEL_OP), (copies, MEMCPY_OP), (sets, MEMSET_OP)]
    pid, device = db.main_process_device([t for t, _ in gpu])
    if pid is None or device is None:  # both None together
        raise ProfileError(
            f"{path}: no GPU activity: the export has no kernels, copies or memsets (did the capture "
            "range run any GPU work?)"
        )
    ops = Ops.concat(
        [
            Ops(t["start"][m], t["end"][m], np.full(int(m.sum()), kind), t["corr"][m])
            for t, kind in gpu
            for m in [(t["pid"] == pid) & (t["dev"] == device)]
        ]
    )
    return DeviceOps(kernels, [t for t, _ in gpu], pid, device, ops)


def nsys_phases(con, schema: db.Schema, pid: int, found: step_finder.Steps) -> dict[str, float]:
    """Host time per step of the phase ranges (data, forward, ...), when the steps are NVTX ranges."""
    if found.basis != step_finder.NVTX_BASIS:
        return {}
    cpu_window = (found.steady[0].start, found.steady[-1].end)
    return {
        name: sum(e - s for _, s, e in db.nvtx_intervals(con, schema, pid, name, cpu_window)) / len(found.steady) / 1e6
        for name in PHASES
    }


def top_kernels(con, schema: db.Schema, groups: dict, params: dict) -> list[dict]:
    """The five kernels with the most time, each with how many launch configurations it ran with."""
    top = groups["ranked"][:5]
    configs = db.launch_configs(
        con, schema, db.kernel_name_column(con, schema, "demangledName"), [k["name"] for k in top], params
    )
    for k in top:
        k["launch_configs"] = configs.get(k["name"])
    return top


def _analyze_nsys(con, path: Path) -> dict:
    schema = db.Schema.read(con)
    check_export(con, schema, path)
    info = db.meta(con, schema)
    health: list[str] = []
    if "OSRuntime" in set(info.get("traced", [])) and not schema.has(db.OSRT):
        health.append("OS runtime tracing was on but the export has no OSRT_API table")
    dev = read_device_ops(con, schema, path, health)
    pid, device, kernels = dev.pid, dev.device, dev.kernels
    mine = (kernels["pid"] == pid) & (kernels["dev"] == device)
    health += event_health(kernels["start"][mine], kernels["end"][mine], kernels["stream"][mine], "kernels")

    found, window = steady_window(
        find_steps(con, schema, kernels, pid, device),
        health,
        lambda steady: db.gpu_window(con, schema, dev.tables, steady, pid, device),
        "launched no GPU work of the main process",
    )
    if window is None:
        window = (int(dev.ops.start.min()), int(dev.ops.end.max()))
    span, n_steps = window[1] - window[0], len(found.steady)
    params = {"w0": window[0], "w1": window[1], "pid": pid, "dev": device}
    line = window_timeline(dev.ops, window)
    gap_info = gap_block(line, nsys_gap_evidence(con, schema, line.long_gaps, pid, device, window), n_steps)

    def inside_of(table: db.Table) -> np.ndarray:
        """The main process's operations on its device that lie within the window."""
        return (
            (table["pid"] == pid)
            & (table["dev"] == device)
            & (table["start"] >= window[0])
            & (table["end"] <= window[1])
        )

    inside = inside_of(kernels)
    groups = db.kernel_groups(con, kernels, inside)
    k_n, k_ns = groups["count"], groups["total_ns"]
    c_n, c_ns, c_b = db.sums(con, db.MEMCPY, params) if schema.has(db.MEMCPY) else (0, 0, 0)
    s_n, s_ns, s_b = db.sums(con, db.MEMSET, params) if schema.has(db.MEMSET) else (0, 0, 0)
    mem = memory_ops(db.memcpy_groups(con, params)) if schema.has(db.MEMCPY) else memory_ops([])
    launch_ns, launch_max_ns = (
        db.call_time(con, db.RUNTIME, pid, db.names_like(con, LAUNCH_CALLS), window)
        if schema.has(db.RUNTIME)
        else (0, 0)
    )
    copies = dev.tables[1]
    peer_copies = copies.where(inside_of(copies) & (copies["copy_kind"] == PEER_COPY_KIND))
    communication = nccl_communication(
        kernels.where(inside), db.names_like(con, ("%nccl%",)), peer_copies, span, n_steps
    )
    return {
        "source": {"path": str(path), "kind": "nsys", **info},
        "window": window_block(window, found),
        "whole_trace": whole_trace(con, schema, kernels),
        **device_metrics(line, span, gap_info, k_ns, c_ns, s_ns, mem),
        "um_migration_bytes_pct": pct(
            sum(v["bytes"] for k, v in mem["by_kind"].items() if k.startswith("UM")), c_b + s_b
        ),
        "top_kernels": top_kernels(con, schema, groups, params),
        "kernels": {
            "count": k_n,
            "total_ns": k_ns,
            "short_pct": pct(groups["short"], k_n),
            "launch_api_ns": launch_ns,
            "launch_api_max_ns": launch_max_ns,
            **kernel_kinds.gemm_time(groups["ranked"]),
        },
        "memcpy": {"count": c_n, "total_ns": c_ns, "bytes": c_b, **mem},
        "memset": {"count": s_n, "total_ns": s_ns, "bytes": s_b},
        "page_faults": db.page_faults(con, schema),
        "gaps": gap_info,
        "communication": communication,
        "nccl_time_pct": communication.get("nccl_time_pct"),
        "exposed_nccl_pct": communication.get("exposed_nccl_pct"),
        "phases_ms_per_step": nsys_phases(con, schema, pid, found),
        "step_ms": step_times(found),
        "time_per_step": nsys_time_per_step(con, dev, window, n_steps),
        "gpu_metrics": db.gpu_metrics(con, schema, window),
        "health": health,
    }


def nsys_time_per_step(con, dev: DeviceOps, window: tuple[int, int], steps: int) -> dict:
    """engine.time_per_step of the main process's device operations in the window: kernels by
    function name (keyed by their StringIds id), copies by direction and memsets under negative keys."""
    kernels, copies, sets = dev.tables
    rows = [
        (t["pid"] == dev.pid) & (t["dev"] == dev.device) & (t["end"] > window[0]) & (t["start"] < window[1])
        for t in dev.tables
    ]
    short, kinds = kernels["short"][rows[0]], copies["copy_kind"][rows[1]]
    names = {k: kernel_kinds.function_name(v) for k, v in db.string_values(con, np.unique(short).tolist()).items()}
    names |= {-100 - kind: f"Memcpy {MEMCPY_KIND.get(kind, kind)}" for kind in np.unique(kinds).tolist()}
    names[-1] = "Memset"
    return time_per_step(
        np.concatenate([t["start"][m] for t, m in zip(dev.tables, rows)]),
        np.concatenate([t["end"][m] for t, m in zip(dev.tables, rows)]),
        np.concatenate([short, -100 - kinds, np.full(int(rows[2].sum()), -1, np.int64)]),  # StringIds ids are > 0
        names,
        window,
        steps,
    )


def nccl_communication(kernels: db.Table, nccl_names: list[int], peer_copies: db.Table, span: int, steps: int) -> dict:
    """Communication on the device in the window: NCCL's share of kernel time, and exposed
    communication, the time NCCL runs while no compute kernel does (what the step waits for). NCCL is
    its kernels and the peer-to-peer copies of its copy-engine collectives (`peer_copies`, no kernel).
    A collective's kernel runs from the moment its rank launches it until every rank has joined, so
    NCCL time per step includes waiting for the slowest rank: across ranks, it tells who waits and
    who is waited for. {} without communication (a run on one GPU)."""
    comm = np.concatenate([np.isin(kernels["name"], nccl_names), np.ones(len(peer_copies), bool)])
    if not comm.any():
        return {}
    start = np.concatenate([kernels["start"], peer_copies["start"]])
    end = np.concatenate([kernels["end"], peer_copies["end"]])
    order = np.argsort(start, kind="stable")
    start, end, comm = start[order], end[order], comm[order]
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


def whole_trace(con, schema: db.Schema, kernel_table: db.Table) -> dict:
    """Whole-trace totals computed the way `nsys stats` reports them (the cross-check)."""
    ops = {}
    if schema.has(db.MEMCPY):
        for kind, count, ns, nbytes in con.execute(
            f"SELECT copyKind, COUNT(*), SUM(end - start), SUM(bytes) FROM {db.MEMCPY} GROUP BY copyKind"
        ):
            ops[MEMCPY_KIND.get(kind, f"kind {kind}")] = {"count": count, "total_ns": ns, "bytes": nbytes}
    if schema.has(db.MEMSET):
        count, ns, nbytes = db.sums(con, db.MEMSET, None)
        if count:
            ops["memset"] = {"count": count, "total_ns": ns, "bytes": nbytes}
    return whole_trace_block(db.kernel_groups(con, kernel_table, None), ops)
