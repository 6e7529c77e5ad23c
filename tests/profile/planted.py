"""Planted profiles of training loops that are not ghsweep's: one timeline of GPU work, host launch
calls and named ranges, written as an nsys SQLite export (the tables' CREATE statements copied
from a real H200 export in tests/data/profiles) and as a PyTorch-profiler Chrome trace, so both
readers see the same run and the truth is known by construction.

The run: a start-up outside any step (pageable weight uploads behind synchronous copies, sparse
kernels), a slow first step (kernels launched late, one after another), then steady compute-bound
steps: GEMMs back to back, launched ahead by the host, ending in a burst of optimizer kernels.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "profiles"
SCHEMA_SOURCES = (DATA / "unified" / "profile.sqlite", DATA / "clean" / "profile.sqlite")
TABLES = (
    "StringIds",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "NVTX_EVENTS",
    "CUDA_UM_CPU_PAGE_FAULT_EVENTS",
    "META_DATA_EXPORT",
)
PID, MAIN_TID, OTHER_TID = 4242, 4242, 4250
US = 1_000
MS = 1_000_000
GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
OPTIMIZER = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>"
    "(T1, T2)"
)
OPTIMIZER_SHORT = "multi_tensor_apply_kernel"


@dataclass
class Run:
    # (start, end, name, correlation id) on the GPU
    kernels: list[tuple[int, int, str, int]] = field(default_factory=list)
    # (start, end, bytes, copyKind, srcKind, dstKind, correlation id)
    copies: list[tuple[int, int, int, int, int, int, int]] = field(default_factory=list)
    # (start, end, name, correlation id) host API calls of the main thread
    calls: list[tuple[int, int, str, int]] = field(default_factory=list)
    # (name, start, end, thread id)
    ranges: list[tuple[str, int, int, int]] = field(default_factory=list)
    steady_busy_ns: int = 0
    steady_span: tuple[int, int] = (0, 0)
    _corr: int = 100

    def launch(self, host_at: int, gpu_at: int, length: int, name: str) -> int:
        self._corr += 1
        self.calls.append((host_at, host_at + 3 * US, "cudaLaunchKernel_v7000", self._corr))
        self.kernels.append((gpu_at, gpu_at + length, name, self._corr))
        return gpu_at + length


def training_run(
    step_name: Callable[[int], str] | None,
    steps: int = 6,
    warmup: bool = True,
    nested: str | None = None,
    burst: tuple[str, ...] = (OPTIMIZER,) * 4,
    loss: str | None = None,
    gemm: str = GEMM,
    gemm_us: int = 200,
) -> Run:
    """The planted run; `step_name(i)` names step i's range (None: no step ranges); `nested` names a
    range inside each step on another thread (a framework's own inner range); `burst`: the kernels
    that end each step; `loss`: a kernel launched once in the middle of each step; `gemm`, `gemm_us`:
    the steady steps' 40 GEMMs, their name and length."""
    run = Run()
    t = 0
    for _ in range(4):  # start-up: weights uploaded from pageable memory with blocking copies
        run._corr += 1
        run.calls.append((t, t + 2 * MS, "cudaMemcpy_v3020", run._corr))
        run.copies.append((t + 500 * US, t + 2 * MS, 64 << 20, 1, 0, 2, run._corr))
        t += 6 * MS
        run.launch(t - 1 * MS, t - 1 * MS + 10 * US, 50 * US, "void at::native::vectorized_elementwise_kernel<4>()")
    for i in range(steps):
        slow = warmup and i == 0
        host0, gpu = t, t + 200 * US
        for j in range(40):  # forward + backward GEMMs
            if slow:  # late launches: the GPU waits for each one
                gpu += 400 * US
                run.launch(gpu + 20 * US, gpu + 30 * US, 100 * US, GEMM)
                gpu += 130 * US
            else:
                gpu = run.launch(host0 + j * 50 * US, gpu + 1 * US, gemm_us * US, gemm)
            if loss is not None and j == 20:
                gpu = run.launch(host0 + j * 50 * US, gpu + 1 * US, 20 * US, loss)
        for j, name in enumerate(burst):  # the optimizer's update
            gpu = run.launch(host0 + (40 + j) * 50 * US, gpu + 1 * US, 100 * US, name)
        end = gpu + 20 * US
        if step_name is not None:
            run.ranges.append((step_name(i), host0, end, MAIN_TID))
        if nested is not None:
            run.ranges.append((nested, host0 + 10 * US, end - 10 * US, OTHER_TID))
        if not slow:
            first = next(k for k in run.kernels if k[0] >= host0)
            run.steady_span = (run.steady_span[0] or first[0], gpu)
            run.steady_busy_ns += sum(k[1] - k[0] for k in run.kernels if k[0] >= host0)
        t = end
    return run


def stream_of(kernel: str) -> int:
    """Compute on stream 7; NCCL collectives on their own stream, as NCCL runs them."""
    return 8 if "nccl" in kernel.lower() else 7


def _create(con: sqlite3.Connection) -> None:
    for source in SCHEMA_SOURCES:
        real = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
        for table in TABLES:
            if not con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
                row = real.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
                if row:
                    con.execute(row[0])
        real.close()


def _insert(con: sqlite3.Connection, table: str, rows: list[dict]) -> None:
    """Rows with the given columns; the table's other NOT NULL columns get 0."""
    info = con.execute(f"PRAGMA table_info({table})").fetchall()
    for row in rows:
        full = {name: 0 for _, name, _, notnull, _, _ in info if notnull} | row
        cols = ", ".join(full)
        con.execute(f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(full))})", list(full.values()))


def write_nsys(run: Run, path: Path) -> Path:
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    _create(con)
    ids: dict[str, int] = {}

    def sid(text: str) -> int:
        if text not in ids:
            ids[text] = len(ids) + 1
            con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (ids[text], text))
        return ids[text]

    gpid, tid = PID << 24, (PID << 24) | MAIN_TID
    short = {GEMM: GEMM, OPTIMIZER: OPTIMIZER_SHORT}
    _insert(
        con,
        "CUPTI_ACTIVITY_KIND_KERNEL",
        [
            {
                "start": s,
                "end": e,
                "deviceId": 0,
                "streamId": stream_of(n),
                "correlationId": c,
                "globalPid": gpid,
                "demangledName": sid(n),
                "shortName": sid(short.get(n, n.split("<")[0].split("::")[-1])),
                "gridX": 132,
                "gridY": 1,
                "gridZ": 1,
                "blockX": 384,
                "blockY": 1,
                "blockZ": 1,
            }
            for s, e, n, c in run.kernels
        ],
    )
    _insert(
        con,
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        [
            {
                "start": s,
                "end": e,
                "deviceId": 0,
                "streamId": 7,
                "correlationId": c,
                "globalPid": gpid,
                "bytes": b,
                "copyKind": k,
                "srcKind": sk,
                "dstKind": dk,
            }
            for s, e, b, k, sk, dk, c in run.copies
        ],
    )
    _insert(
        con,
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        [{"start": s, "end": e, "globalTid": tid, "correlationId": c, "nameId": sid(n)} for s, e, n, c in run.calls],
    )
    _insert(
        con,
        "NVTX_EVENTS",
        [{"start": s, "end": e, "eventType": 59, "text": n, "globalTid": (PID << 24) | t} for n, s, e, t in run.ranges],
    )
    _insert(con, "META_DATA_EXPORT", [{"name": "EXPORT_SCHEMA_VERSION", "value": "3.20.0"}])
    con.commit()
    con.close()
    return path


def write_torch(run: Run, path: Path, array: bool = False) -> Path:
    """The Chrome trace the PyTorch profiler writes (times in us); `array`: the bare-array layout."""
    events: list[dict] = []
    copy_name = {(1, 0): "Memcpy HtoD (Pageable -> Device)", (1, 1): "Memcpy HtoD (Pinned -> Device)"}
    for s, e, n, c in run.kernels:
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": n,
                "pid": 0,
                "tid": 7,
                "ts": s / 1e3,
                "dur": (e - s) / 1e3,
                "args": {"correlation": c, "device": 0, "stream": stream_of(n)},
            }
        )
    for s, e, b, k, sk, _, c in run.copies:
        events.append(
            {
                "ph": "X",
                "cat": "gpu_memcpy",
                "name": copy_name[(k, sk)],
                "pid": 0,
                "tid": 7,
                "ts": s / 1e3,
                "dur": (e - s) / 1e3,
                "args": {"correlation": c, "bytes": b},
            }
        )
    for s, e, n, c in run.calls:
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": n.split("_v")[0],
                "pid": PID,
                "tid": MAIN_TID,
                "ts": s / 1e3,
                "dur": (e - s) / 1e3,
                "args": {"correlation": c},
            }
        )
    for n, s, e, t in run.ranges:
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": n,
                "pid": PID,
                "tid": t,
                "ts": s / 1e3,
                "dur": (e - s) / 1e3,
                "args": {},
            }
        )
    trace = events if array else {"traceEvents": events, "deviceProperties": [{"name": "planted GPU"}]}
    text = json.dumps(trace)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


# Ranks of a sweep on 1 and N GPUs (profile/scaling.py's decomposition), every term known by construction.
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
CAST = "void fsdp_cast_kernel<float, bf16>()"
STEPS, GEMMS = 6, 20


def planted_rank(
    gemm_us: int,
    slowest_gemm_us: int,
    tail_us: int,
    idle_us: int,
    cast_us: int,
    buckets: bool,
    collective: str = ALLREDUCE,
) -> Run:
    """One rank: per step, GEMMs back to back, a cast kernel (cast_us > 0), a final `collective`
    (an all-reduce) that waits for the slowest rank then runs tail_us, the optimizer; idle_us between
    steps; `buckets`: a `collective` beside every fifth GEMM on the NCCL stream (hidden by compute)."""
    run = Run()
    gpu = 1_000 * US
    for i in range(STEPS):
        gpu += idle_us * US if i else 0
        host0 = gpu  # the host launches the step as its GPU work begins (step ranges do not overlap)
        for j in range(GEMMS):
            gemm_start = gpu
            gpu = run.launch(host0 + j * US, gpu, gemm_us * US, GEMM)
            if buckets and j % 5 == 0:
                run.launch(host0 + j * US, gemm_start, gemm_us * US // 2, collective)
        if cast_us:
            gpu = run.launch(host0 + 30 * US, gpu, cast_us * US, CAST)
        wait = GEMMS * (slowest_gemm_us - gemm_us) * US
        if tail_us or wait:
            gpu = run.launch(host0 + 31 * US, gpu, wait + tail_us * US, collective)
        gpu = run.launch(host0 + 32 * US, gpu, 100 * US, OPTIMIZER)
        run.ranges.append((f"step {i}", host0, gpu, 4242))
    return run


# 1 GPU: GEMMs of 200 us, 50 us idle between steps. 2 GPUs: GEMMs of 210 and 230 us (slower beside
# NCCL, rank 1 more so), a 40 us cast, a 300 us tail all-reduce, 150 us idle between steps.
ONE = {"gemm_us": 200, "slowest_gemm_us": 200, "tail_us": 0, "idle_us": 50, "cast_us": 0, "buckets": False}
RANKS = [
    {"gemm_us": 210, "slowest_gemm_us": 230, "tail_us": 300, "idle_us": 150, "cast_us": 40, "buckets": True},
    {"gemm_us": 230, "slowest_gemm_us": 230, "tail_us": 300, "idle_us": 150, "cast_us": 40, "buckets": True},
]
