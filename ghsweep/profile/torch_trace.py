"""The same analysis as for nsys (analysis.py), from a PyTorch-profiler Chrome trace: the
portable fallback (profile=torch), which also works on a CPU-only run.

Trace times are microseconds (floats); they are turned into integer nanoseconds so every number
has the unit of the nsys path. A trace without GPU activity (a CPU run) reports the top CPU
operators by self time in `top_kernels`, and the GPU metrics as null. Both Chrome trace layouts
are read: an object with `traceEvents`, and a bare array of events.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from ghsweep.core.errors import ProfileError, first_line
from ghsweep.core.names import PHASES
from ghsweep.profile import kernel_kinds
from ghsweep.profile import steps as step_finder
from ghsweep.profile.engine import (
    MEMCPY_KIND,
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
    whole_trace_steps,
    window_block,
    window_timeline,
)
from ghsweep.profile.nsys_db import PAGEABLE_MIN_BYTES, SHORT_KERNEL_NS
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.profile.timeline import KERNEL as KERNEL_OP
from ghsweep.profile.timeline import MEMCPY as MEMCPY_OP
from ghsweep.profile.timeline import MEMSET as MEMSET_OP
from ghsweep.profile.timeline import Ops

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# The categories of traces from PyTorch up to about 1.9 (Kineto's first layout), as today's names.
OLD_CATS = {
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "Runtime": "cuda_runtime",
    "Operator": "cpu_op",
}
# Host categories; an event of any other category with a device in its name is an accelerator's
# activity this reader does not measure (Intel XPU, Habana HPU, MTIA, PrivateUse1 backends).
ACCELERATOR_CAT = re.compile(r"xpu|hpu|mtia|privateuse1|tpu|npu", re.IGNORECASE)
# PyTorch's own DataLoader ranges ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
# "..._MultiProcessingDataLoaderIter.__next__", "DataLoader.__next__"), and user ranges "data*".
DATA_RANGE = re.compile(r"^data|DataLoader|DataLoaderIter", re.IGNORECASE)
OP_KIND = {"kernel": KERNEL_OP, "gpu_memcpy": MEMCPY_OP, "gpu_memset": MEMSET_OP}
# CUDA's synchronising calls and blocking copies, and ROCm's (HIP) of the same names.
SYNC_NAMES = re.compile(
    r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cudaMemcpy$|"
    r"cudaStreamQuery|cuCtxSynchronize|cuStreamSynchronize|"
    r"hipDeviceSynchronize|hipStreamSynchronize|hipEventSynchronize|hipMemcpy$)"
)
# record_function ranges: user_annotation; a DataLoader's own range is a cpu_op in some versions.
HOST_RANGE_CATS = ("user_annotation", "cpu_op")
# "Memcpy HtoD (Pageable -> Device)"
MEMCPY_NAME = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
COPY_KIND = {"HtoD": 1, "DtoH": 2, "DtoD": 8, "PtoP": 10}
HOST_KIND = {"Pageable": 0, "Pinned": 1, "Device": 2, "Managed": 4}


def _ns(event: dict) -> tuple[int, int]:
    start = int(round(event["ts"] * 1000))
    return start, start + int(round(event["dur"] * 1000))


def trace_events(trace, path: Path) -> list[dict]:
    """The complete ("X") events of a trace, each with name, cat, ts, dur and args present."""
    raw = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(raw, list):
        raise ProfileError(f"{path}: not a Chrome trace: no list of trace events (traceEvents)")
    events = []
    for e in raw:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur", 0)
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        args = e.get("args")
        cat = str(e.get("cat", ""))
        events.append(
            {
                "name": str(e.get("name", "")),
                "cat": OLD_CATS.get(cat, cat),
                "ts": ts,
                "dur": dur,
                "args": args if isinstance(args, dict) else {},
                "pid": e.get("pid"),
                "tid": e.get("tid"),
            }
        )
    if not events:
        raise ProfileError(f"{path}: an empty trace: no complete events (was the profiler's window ever reached?)")
    return events


def find_steps(events: list[dict], gpu: list[dict]) -> step_finder.Steps | None:
    """Steps from record_function ranges (the PyTorch profiler's user annotations), else from the
    optimizer bursts of the GPU work, else None."""
    # ProfilerStep#N is a cpu_op in some PyTorch versions; no operator is named like a step.
    ranges = [(e["name"], *_ns(e)) for e in events if e["cat"] in ("user_annotation", "cpu_op")]
    found = step_finder.from_ranges(ranges, "profiler ranges (record_function)")
    kernels = sorted((e for e in gpu if e["cat"] == "kernel"), key=lambda e: e["ts"])
    if found is not None or not kernels:
        return found
    spans = np.array([_ns(e) for e in kernels], dtype=np.int64)
    names, keys = np.unique([e["name"] for e in kernels], return_inverse=True)
    return infer_steps(spans[:, 0], spans[:, 1], keys.ravel(), dict(enumerate(names.tolist())))


def analyze_torch_trace(path: Path) -> ProfileAnalysis:
    path = Path(path)
    trace = load_json(path)
    events = trace_events(trace, path)
    gpu = [e for e in events if e["cat"] in GPU_CATS]
    props = ((trace.get("deviceProperties") if isinstance(trace, dict) else None) or [{}])[0]
    accelerator = sorted({e["cat"] for e in events if ACCELERATOR_CAT.search(e["cat"])})
    source = {
        "path": str(path),
        "kind": "torch",
        "gpu_name": props.get("name") if isinstance(props, dict) else None,
        "device": "cuda" if gpu else ("accelerator" if accelerator else "cpu"),
    }
    if accelerator and not gpu:
        source["accelerator_categories"] = accelerator
    health: list[str] = []
    found = find_steps(events, gpu)
    if not gpu:
        return ProfileAnalysis(source=source, **cpu_only(path, events, found, health))
    return ProfileAnalysis(source=source, **gpu_analysis(events, gpu, found, health))


def gpu_analysis(events: list[dict], gpu: list[dict], found: step_finder.Steps | None, health: list[str]) -> dict:
    """The analysis of a trace with GPU activity: its operations go through the shared engine."""
    runtime = [e for e in events if e["cat"] in ("cuda_runtime", "cuda_driver")]
    kernel_events = [e for e in gpu if e["cat"] == "kernel"]
    kernel_spans = np.array([_ns(e) for e in kernel_events], dtype=np.int64).reshape(-1, 2)
    streams = np.array([st if isinstance(st := e["args"].get("stream"), int) else -1 for e in kernel_events])
    health += event_health(kernel_spans[:, 0], kernel_spans[:, 1], streams, "kernels")
    found, window = steady_window(found, health, lambda steady: project(steady, runtime, gpu), "launched no GPU work")
    if window is None:
        spans = [_ns(e) for e in gpu]
        window = (min(s for s, _ in spans), max(e for _, e in spans))
    w0, w1 = window
    inside = [(max(s, w0), min(e, w1), ev) for ev in gpu for s, e in [_ns(ev)] if e > w0 and s < w1]
    line = window_timeline(device_ops(gpu), window)
    gap_info = gap_block(line, gap_evidence(events, runtime), len(found.steady))
    time_of = {cat: sum(e - s for s, e, ev in inside if ev["cat"] == cat) for cat in GPU_CATS}
    kernel_ns, copy_ns, set_ns = (time_of[cat] for cat in GPU_CATS)
    mem = memory_ops([(*k, *v) for k, v in copy_groups(inside).items()])
    kernels = ranked((ev["name"], e - s) for s, e, ev in inside if ev["cat"] == "kernel")
    launch_spans = [_ns(ev) for ev in runtime if "Launch" in ev["name"]]
    w_launches = [e - s for s, e in launch_spans if e > w0 and s < w1]
    return {
        "window": window_block(window, found),
        "whole_trace": whole_trace_block(
            ranked((e["name"], e["dur"] * 1000) for e in gpu if e["cat"] == "kernel"), whole_trace_memory_ops(gpu)
        ),
        **device_metrics(line, w1 - w0, gap_info, kernel_ns, copy_ns, set_ns, mem),
        "top_kernels": kernels["ranked"][:5],
        "kernels": {
            "count": kernels["count"],
            "total_ns": kernel_ns,
            "short_pct": pct(kernels["short"], kernels["count"]),
            "launch_api_ns": sum(w_launches),
            "launch_api_max_ns": max(w_launches, default=0),
            **kernel_kinds.gemm_time(kernels["ranked"]),
        },
        "memcpy": {"count": sum(r["count"] for r in mem["copies"]), "total_ns": copy_ns, **mem},
        "memset": {"count": sum(ev["cat"] == "gpu_memset" for *_, ev in inside), "total_ns": set_ns},
        "gaps": gap_info,
        "phases_ms_per_step": phases(events, found),
        "step_ms": step_times(found),
        "time_per_step": torch_time_per_step(gpu, window, len(found.steady)),
        "health": health,
    }


def op_label(event: dict) -> str:
    """A device event's name for time_per_step: a kernel's function name, a copy's direction."""
    if event["cat"] == "kernel":
        return kernel_kinds.function_name(event["name"])
    if event["cat"] == "gpu_memcpy":
        m = MEMCPY_NAME.match(event["name"])
        return f"Memcpy {m.group(1)}" if m else "Memcpy"
    return "Memset"


def torch_time_per_step(gpu: list[dict], window: tuple[int, int], steps: int) -> dict:
    spans = np.array([_ns(e) for e in gpu], dtype=np.int64).reshape(-1, 2)
    names, keys = np.unique([op_label(e) for e in gpu], return_inverse=True)
    return time_per_step(spans[:, 0], spans[:, 1], keys.ravel(), dict(enumerate(names.tolist())), window, steps)


def device_ops(gpu: list[dict]) -> Ops:
    """The trace's GPU events as the engine's operations (a missing correlation id: -1)."""
    spans = np.array([_ns(e) for e in gpu], dtype=np.int64).reshape(-1, 2)
    corr = [c if isinstance(c := e["args"].get("correlation"), int) else -1 for e in gpu]
    return Ops(
        spans[:, 0],
        spans[:, 1],
        np.array([OP_KIND[e["cat"]] for e in gpu], dtype=np.int64),
        np.array(corr, dtype=np.int64),
    )


def gap_evidence(events: list[dict], runtime: list[dict]) -> GapEvidence:
    """What a trace tells of the host during gaps: synchronising calls, "data*" ranges, launches
    (no OS waits, page faults or migrations: the profiler does not record them)."""
    return GapEvidence(
        sync=Intervals(_ns(e) for e in runtime if SYNC_NAMES.match(e["name"])),
        data=Intervals(_ns(e) for e in events if e["cat"] in HOST_RANGE_CATS and DATA_RANGE.search(e["name"])),
        launches={e["args"].get("correlation"): (_ns(e)[0], None) for e in runtime},
    )


def copy_groups(copies) -> dict[tuple, list[int]]:
    """(copyKind, srcKind, dstKind) -> [count, ns, bytes, big count, big bytes] of (start, end, event) copies."""
    groups: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for s, e, ev in copies:
        m = MEMCPY_NAME.match(ev["name"]) if ev["cat"] == "gpu_memcpy" else None
        if m:
            nbytes = _bytes(ev)
            g = groups[(COPY_KIND.get(m.group(1), 0), HOST_KIND.get(m.group(2), 7), HOST_KIND.get(m.group(3), 7))]
            g[0] += 1
            g[1] += e - s
            g[2] += nbytes
            g[3] += nbytes >= PAGEABLE_MIN_BYTES
            g[4] += nbytes if nbytes >= PAGEABLE_MIN_BYTES else 0
    return groups


def whole_trace_memory_ops(gpu: list[dict]) -> dict:
    """Copies per direction and memsets of the whole trace, as nsys_analysis.whole_trace counts them."""
    out: dict[str, dict] = {}
    for (kind, _, _), (count, ns, nbytes, _, _) in copy_groups((*_ns(e), e) for e in gpu).items():
        entry = out.setdefault(MEMCPY_KIND.get(kind, f"kind {kind}"), {"count": 0, "total_ns": 0, "bytes": 0})
        entry["count"] += count
        entry["total_ns"] += ns
        entry["bytes"] += nbytes
    sets = [e for e in gpu if e["cat"] == "gpu_memset"]
    if sets:
        out["memset"] = {
            "count": len(sets),
            "total_ns": sum(_ns(e)[1] - _ns(e)[0] for e in sets),
            "bytes": sum(_bytes(e) for e in sets),
        }
    return out


def _bytes(event: dict) -> int:
    value = event["args"].get("bytes", 0)
    return int(value) if isinstance(value, (int, float)) else 0


def project(
    steady: list[step_finder.Step], runtime: list[dict], gpu: list[dict]
) -> tuple[tuple[int, int] | None, bool]:
    """GPU span of the work launched inside the steady steps, and whether it was found through the
    launches' correlation ids (else by time: see nsys_db.gpu_window)."""
    first, last = steady[0].start, steady[-1].end
    launched = [(_ns(e)[0], c) for e in runtime if isinstance(c := e["args"].get("correlation"), int)]
    if not launched:
        spans = [_ns(e) for e in gpu if first <= _ns(e)[0] <= last]
        return ((min(s for s, _ in spans), max(e for _, e in spans)) if spans else None), False
    corrs = [c for start, c in launched if first <= start <= last]
    if not corrs:
        return None, True
    lo, hi = min(corrs), max(corrs)
    spans = [_ns(e) for e in gpu if isinstance(c := e["args"].get("correlation"), int) and lo <= c <= hi]
    return ((min(s for s, _ in spans), max(e for _, e in spans)) if spans else None), True


def cpu_only(path: Path, events: list[dict], found: step_finder.Steps | None, health: list[str]) -> dict:
    """A CPU run: top operators by self time in the steady steps; no device metrics (they stay None)."""
    ops = [e for e in events if e["cat"] == "cpu_op"]
    if not ops:
        raise ProfileError(f"{path}: neither GPU activity nor CPU operators in the trace: nothing to analyse")
    if found is None:
        found = whole_trace_steps(health, "no step ranges")
        spans = [_ns(e) for e in ops]
        window = (min(s for s, _ in spans), max(e for _, e in spans))
    else:
        window = (found.steady[0].start, found.steady[-1].end)
        ops = [e for e in ops if window[0] <= _ns(e)[0] and _ns(e)[1] <= window[1]]
    block = window_block(window, found)
    block["basis"] = "cpu steps" if found.steady else block["basis"]
    return {
        "window": block,
        "top_kernels": ranked(self_times(ops), function_names=False)["ranked"][:5],
        "phases_ms_per_step": phases(events, found),
        "step_ms": step_times(found),
        "health": health,
    }


def self_times(ops: list[dict]) -> list[tuple[str, int]]:
    """(name, self ns) of each operator: its time minus that of the operators nested in it, per thread."""
    self_ns = []
    by_thread: dict = defaultdict(list)
    for e in ops:
        by_thread[(e["pid"], e["tid"])].append(_ns(e) + (e["name"],))
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
    return self_ns


def phases(events: list[dict], found: step_finder.Steps) -> dict[str, float]:
    if found.basis != step_finder.NVTX_BASIS or not found.steady:
        return {}
    lo, hi = found.steady[0].start, found.steady[-1].end
    out = dict.fromkeys(PHASES, 0.0)
    for e in events:
        if e["cat"] == "user_annotation" and e["name"] in out:
            s, end = _ns(e)
            if lo <= s and end <= hi:
                out[e["name"]] += (end - s) / len(found.steady) / 1e6
    return out


def ranked(items, function_names: bool = True) -> dict:
    """(name, ns) items grouped by name: {ranked: [{name, short_name, total_ns, count, mean_ns, pct}]
    by total time, count, total_ns, short: how many ran < SHORT_KERNEL_NS} (nsys_db.kernel_groups' shape)."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    short = 0
    for name, ns in items:
        ns = int(round(ns))
        totals[name][0] += ns
        totals[name][1] += 1
        short += ns < SHORT_KERNEL_NS
    whole = sum(t for t, _ in totals.values())
    order = sorted(totals.items(), key=lambda kv: -kv[1][0])
    return {
        "ranked": [
            {
                "name": n,
                "short_name": kernel_kinds.function_name(n) if function_names else n,
                "total_ns": t,
                "count": c,
                "mean_ns": t / c,
                "pct": pct(t, whole),
            }
            for n, (t, c) in order
        ],
        "count": sum(c for _, c in totals.values()),
        "total_ns": whole,
        "short": short,
    }


def load_json(path: Path):
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path}: not a readable JSON trace ({first_line(exc)})") from None
