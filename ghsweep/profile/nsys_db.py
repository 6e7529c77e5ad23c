"""Reading an Nsight Systems SQLite export with SQL aggregation.

The big tables (kernels, memcpy, memset, runtime API calls) are read once each, streamed in chunks
into int64 numpy columns (never one Python object per row): unions, gaps and per-name sums are
vector operations on them (timeline.py). Selective lookups (step ranges, OS waits, copy groups)
are SQL aggregations or filtered queries, and only small results come back as rows.

Tables appear only when their data was captured, and columns change across nsys versions, so
every query first checks what the export has.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ghsweep.profile import timeline
from ghsweep.profile.steps import STEP_LIKE, Step

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"
OSRT = "OSRT_API"
UM_CPU_FAULTS = "CUDA_UM_CPU_PAGE_FAULT_EVENTS"
UM_GPU_FAULTS = "CUDA_UM_GPU_PAGE_FAULT_EVENTS"
# `--gpu-metrics-devices`: samples (timestamp ns, typeId, metricId, value) and the metrics' names.
GPU_METRICS = "GPU_METRICS"
GPU_METRICS_INFO = "TARGET_INFO_GPU_METRICS"

# NVTX_EVENTS.eventType of a push/pop range (59) and a start/end range (60).
NVTX_RANGE_TYPES = (59, 60)
# globalPid = globalTid with the 24 thread bits cleared (0xFFFFFFFFFF000000 as SQLite's signed
# 64-bit integer; the unsigned literal would turn into a float there).
PID_MASK = ~0xFFFFFF


def open_readonly(path: Path) -> sqlite3.Connection:
    """Open an export without ever writing to it (temp tables live in memory)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.execute("PRAGMA temp_store = MEMORY")
    con.execute("PRAGMA cache_size = -262144")  # 256 MiB page cache: bounded memory on big files
    return con


@dataclass
class Schema:
    tables: set[str]
    columns: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def read(cls, con: sqlite3.Connection) -> Schema:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        return cls(tables)

    def has(self, table: str, con: sqlite3.Connection | None = None, column: str | None = None) -> bool:
        if table not in self.tables:
            return False
        if column is None:
            return True
        if table not in self.columns and con is not None:
            self.columns[table] = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
        return column in self.columns.get(table, set())


def _nvtx_name(con: sqlite3.Connection, schema: Schema) -> tuple[str, str]:
    """(SQL expression of an NVTX event's name, the join it needs): text inline or through StringIds."""
    if schema.has(NVTX, con, "textId") and schema.has("StringIds"):
        return "COALESCE(e.text, s.value)", "LEFT JOIN StringIds s ON s.id = e.textId"
    return "e.text", ""


def step_candidates(con: sqlite3.Connection, schema: Schema, pid: int | None) -> list[tuple[str, int, int]]:
    """(name, start, end) of the NVTX ranges of process `pid` (any thread) whose name may be a
    step's (steps.STEP_LIKE); steps.from_ranges decides which are."""
    if not schema.has(NVTX) or not schema.has(NVTX, con, "globalTid"):
        return []
    name, join = _nvtx_name(con, schema)
    like = " OR ".join(f"{name} LIKE ?" for _ in STEP_LIKE)
    thread = f"AND (e.globalTid & {PID_MASK}) = ?" if pid is not None else ""
    return con.execute(
        f"SELECT {name}, e.start, e.end FROM {NVTX} e {join} WHERE e.eventType IN {NVTX_RANGE_TYPES} "
        f"AND e.end IS NOT NULL AND ({like}) {thread} ORDER BY e.start",
        [*STEP_LIKE, *([pid] if pid is not None else [])],
    ).fetchall()


def kernel_name_column(con: sqlite3.Connection, schema: Schema, column: str) -> str:
    """`column` (demangledName or shortName) when the kernel table has it, else the other one."""
    other = "shortName" if column == "demangledName" else "demangledName"
    return column if schema.has(KERNEL, con, column) else other


# A kernel shorter than this does too little work to hide its launch.
SHORT_KERNEL_NS = 10_000
# Rows fetched per chunk while streaming a table into columns.
CHUNK_ROWS = 1 << 18


def read_columns(con: sqlite3.Connection, sql: str, params=()) -> list[np.ndarray]:
    """The result of `sql` as one int64 array per column, fetched in chunks (NULL must be
    COALESCEd in the query)."""
    cur = con.execute(sql, params)
    width = len(cur.description)
    parts: list[list[np.ndarray]] = [[] for _ in range(width)]
    while rows := cur.fetchmany(CHUNK_ROWS):
        block = np.array(rows, dtype=np.int64).reshape(len(rows), width)
        for i in range(width):
            parts[i].append(block[:, i].copy())
    return [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]


@dataclass
class Table:
    """Columns of one big table, by name."""

    cols: dict[str, np.ndarray]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name]

    def __len__(self) -> int:
        return len(next(iter(self.cols.values()))) if self.cols else 0

    def where(self, mask: np.ndarray) -> Table:
        return Table({k: v[mask] for k, v in self.cols.items()})


def read_table(con: sqlite3.Connection, schema: Schema, table: str, columns: dict[str, str]) -> Table:
    """Stream `table` into columns; `columns` maps our names to SQL expressions."""
    if not schema.has(table):
        return Table({k: np.empty(0, np.int64) for k in columns})
    exprs = ", ".join(f"COALESCE({expr}, -1)" for expr in columns.values())
    return Table(dict(zip(columns, read_columns(con, f"SELECT {exprs} FROM {table}"))))


GPU_COLUMNS = {"start": "start", "end": "end", "corr": "correlationId", "pid": "globalPid", "dev": "deviceId"}


def kernel_columns(con: sqlite3.Connection, schema: Schema) -> dict[str, str]:
    cols = dict(GPU_COLUMNS, name=kernel_name_column(con, schema, "demangledName"))
    cols["short"] = kernel_name_column(con, schema, "shortName")
    cols["stream"] = "streamId" if schema.has(KERNEL, con, "streamId") else "-1"  # -1: unknown
    return cols


def main_process_device(tables: list[Table]) -> tuple[int | None, int | None]:
    """(globalPid, deviceId) that ran the most GPU time (kernels, copies, memsets): the trainer on
    its GPU, not helpers. (None, None) without GPU activity."""
    pid = np.concatenate([t["pid"] for t in tables])
    if not len(pid):
        return None, None
    dev = np.concatenate([t["dev"] for t in tables])
    dur = np.concatenate([t["end"] - t["start"] for t in tables])
    pairs, inverse = np.unique(np.stack([pid, dev], axis=1), axis=0, return_inverse=True)
    best = int(np.argmax(np.bincount(inverse.ravel(), weights=dur.astype(np.float64))))
    return int(pairs[best][0]), int(pairs[best][1])


def gpu_window(
    con: sqlite3.Connection, schema: Schema, gpu: list[Table], steps: list[Step], pid: int, device: int
) -> tuple[tuple[int, int] | None, bool]:
    """The GPU time span of the work launched inside `steps` (NVTX ranges projected on the GPU),
    and whether it was projected through the launches (False: by time alone).

    NVTX ranges are CPU times; the GPU runs behind the CPU, and at the start of a capture it is
    still busy with work launched before the capture (which is not traced). So the window starts
    at the first GPU operation launched in the first step and ends at the end of the last one
    launched in the last step. CUDA correlation ids grow with launch order within a process.
    Without the runtime API table the launches are unknown: the window is then the GPU work that
    started inside the steps' CPU span (a lag of the GPU behind the CPU shifts it).
    """
    if not steps:
        return None, False
    first, last = steps[0].start, steps[-1].end
    projected = schema.has(RUNTIME) and schema.has(RUNTIME, con, "correlationId")
    if projected:
        lo, hi = con.execute(
            f"SELECT MIN(CASE WHEN start >= ? THEN correlationId END), "
            f"MAX(CASE WHEN start <= ? THEN correlationId END) FROM {RUNTIME} WHERE (globalTid & {PID_MASK}) = ?",
            (first, last, pid),
        ).fetchone()
        if lo is None or hi is None:
            return None, True
    starts, ends = [], []
    for t in gpu:
        inside = (t["pid"] == pid) & (t["dev"] == device)
        inside &= (
            ((t["corr"] >= lo) & (t["corr"] <= hi)) if projected else ((t["start"] >= first) & (t["start"] <= last))
        )
        if inside.any():
            starts.append(t["start"][inside].min())
            ends.append(t["end"][inside].max())
    return ((int(min(starts)), int(max(ends))) if starts else None), projected


def kernel_groups(con: sqlite3.Connection, kernels: Table, mask: np.ndarray | None) -> dict:
    """Kernels grouped by name (rows in `mask`; None: all): the ranked list (name, short_name,
    total_ns, count, mean_ns, pct of kernel time), totals, and how many ran < 10 us."""
    rows = kernels if mask is None else kernels.where(mask)
    dur = rows["end"] - rows["start"]
    groups = timeline.group_sums(rows["name"], dur, SHORT_KERNEL_NS)
    all_total = int(dur.sum())
    first = {}
    if groups:
        uniq, index = np.unique(rows["name"], return_index=True)
        first = dict(zip(uniq.tolist(), rows["short"][index].tolist()))
    names = string_values(con, {g[0] for g in groups} | set(first.values()))
    ranked = [
        {
            "name": names.get(key, str(key)),
            "short_name": _string_or_id(names, first.get(key)),
            "total_ns": total,
            "count": count,
            "mean_ns": total / count,
            "pct": 100.0 * total / all_total if all_total else 0.0,
        }
        for key, total, count, _ in groups
    ]
    return {"ranked": ranked, "count": len(dur), "total_ns": all_total, "short": sum(g[3] for g in groups)}


def _string_or_id(names: dict[int, str], key: int | None) -> str:
    """The string of id `key`, else the id itself in words ("None" for no id)."""
    return str(key) if key is None else names.get(key, str(key))


def string_values(con: sqlite3.Connection, ids) -> dict[int, str]:
    ids = [i for i in ids if i is not None]
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    return dict(con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", ids).fetchall())


def sums(con: sqlite3.Connection, table: str, params: dict | None) -> tuple[int, int, int]:
    """(count, total duration ns, total bytes) of a GPU table, in the window or the whole trace."""
    has_bytes = table != KERNEL
    where = ("WHERE globalPid = :pid AND deviceId = :dev AND start >= :w0 AND end <= :w1") if params else ""
    row = con.execute(
        f"SELECT COUNT(*), COALESCE(SUM(end - start), 0), {'COALESCE(SUM(bytes), 0)' if has_bytes else '0'} "
        f"FROM {table} {where}",
        params or {},
    ).fetchone()
    return tuple(row)


def memcpy_groups(con: sqlite3.Connection, params: dict | None) -> list[tuple]:
    """(copyKind, srcKind, dstKind, count, ns, bytes, big pageable count, big pageable bytes) groups."""
    where = ("WHERE globalPid = :pid AND deviceId = :dev AND start >= :w0 AND end <= :w1") if params else ""
    return con.execute(
        f"SELECT copyKind, srcKind, dstKind, COUNT(*), SUM(end - start), SUM(bytes), "
        f"SUM(bytes >= {PAGEABLE_MIN_BYTES}), SUM(CASE WHEN bytes >= {PAGEABLE_MIN_BYTES} THEN bytes ELSE 0 END) "
        f"FROM {MEMCPY} {where} GROUP BY copyKind, srcKind, dstKind",
        params or {},
    ).fetchall()


# Copies from or to pageable host memory at least this big are worth pinning.
PAGEABLE_MIN_BYTES = 1 << 20


def names_like(con: sqlite3.Connection, patterns: tuple[str, ...]) -> list[int]:
    """StringIds ids whose value is one of `patterns` (SQL LIKE, backslash escapes: 'cudaMemcpy\\_%'
    is cudaMemcpy_v3020, never cudaMemcpyAsync_v3020), e.g. 'cudaStreamSynchronize%'."""
    clause = " OR ".join("value LIKE ? ESCAPE '\\'" for _ in patterns)
    return [r[0] for r in con.execute(f"SELECT id FROM StringIds WHERE {clause}", patterns)]


def process_intervals(
    con: sqlite3.Connection, table: str, pid: int, name_ids: list[int], window: tuple[int, int]
) -> list[tuple[int, int, int]]:
    """(globalTid, start, end) of the calls of `table` (runtime API or OS runtime) named by
    `name_ids`, on any thread of process `pid`, overlapping the window."""
    if not name_ids:
        return []
    marks = ",".join("?" * len(name_ids))
    return con.execute(
        f"SELECT globalTid, start, end FROM {table} WHERE (globalTid & {PID_MASK}) = ? AND nameId IN ({marks}) "
        "AND end > ? AND start < ? ORDER BY start",
        [pid, *name_ids, *window],
    ).fetchall()


def call_time(
    con: sqlite3.Connection, table: str, pid: int, name_ids: list[int], window: tuple[int, int]
) -> tuple[int, int]:
    """(total, longest) duration of the calls named by `name_ids` in process `pid` inside the window."""
    if not name_ids:
        return 0, 0
    marks = ",".join("?" * len(name_ids))
    return con.execute(
        f"SELECT COALESCE(SUM(end - start), 0), COALESCE(MAX(end - start), 0) FROM {table} "
        f"WHERE (globalTid & {PID_MASK}) = ? AND nameId IN ({marks}) AND end > ? AND start < ?",
        [pid, *name_ids, *window],
    ).fetchone()


def launch_calls(con: sqlite3.Connection, pid: int, correlation_ids: list[int]) -> dict[int, tuple[int, int]]:
    """(start, globalTid) of the API call behind each correlation id (one scan of the runtime table)."""
    if not correlation_ids:
        return {}
    con.execute("CREATE TEMP TABLE IF NOT EXISTS gap_corr (c INTEGER PRIMARY KEY)")
    con.execute("DELETE FROM gap_corr")
    con.executemany("INSERT OR IGNORE INTO gap_corr VALUES (?)", [(c,) for c in correlation_ids])
    rows = con.execute(
        f"SELECT r.correlationId, r.start, r.globalTid FROM {RUNTIME} r JOIN gap_corr g ON g.c = r.correlationId "
        f"WHERE (r.globalTid & {PID_MASK}) = ?",
        (pid,),
    ).fetchall()
    return {c: (start, tid) for c, start, tid in rows}


def nvtx_intervals(
    con: sqlite3.Connection, schema: Schema, pid: int | None, like: str, window: tuple[int, int]
) -> list[tuple[str, int, int]]:
    """NVTX push/pop or start/end ranges of process `pid` whose name is LIKE `like`, overlapping
    `window` (CPU time)."""
    if not schema.has(NVTX) or not schema.has(NVTX, con, "globalTid"):
        return []
    name, join = _nvtx_name(con, schema)
    thread = f"AND (e.globalTid & {PID_MASK}) = :pid" if pid is not None else ""
    return con.execute(
        f"SELECT {name}, e.start, e.end FROM {NVTX} e {join} WHERE e.eventType IN {NVTX_RANGE_TYPES} "
        f"AND e.end IS NOT NULL AND {name} LIKE :like AND e.end > :w0 AND e.start < :w1 {thread} ORDER BY e.start",
        {"like": like, "w0": window[0], "w1": window[1], "pid": pid},
    ).fetchall()


def meta(con: sqlite3.Connection, schema: Schema) -> dict:
    """Export version, traced event types, and the GPU's name and memory bandwidth."""
    out: dict = {}
    if schema.has("META_DATA_EXPORT"):
        out.update(
            {
                k: v
                for k, v in con.execute(
                    "SELECT name, value FROM META_DATA_EXPORT "
                    "WHERE name IN ('EXPORT_PRODUCT_VERSION', 'EXPORT_SCHEMA_VERSION')"
                )
            }
        )
    if schema.has("META_DATA_CAPTURE"):
        out["traced"] = sorted(
            v for (v,) in con.execute("SELECT value FROM META_DATA_CAPTURE WHERE name = 'CAPTURE_EVENT_TYPE'")
        )
    if schema.has("TARGET_INFO_GPU"):
        row = con.execute("SELECT name, memoryBandwidth, smCount FROM TARGET_INFO_GPU ORDER BY id LIMIT 1").fetchone()
        if row:
            out.update(gpu_name=row[0], gpu_memory_bandwidth=row[1], gpu_sm_count=row[2])
    return out


def cpu_page_faults(con: sqlite3.Connection, schema: Schema, pid: int, window: tuple[int, int]) -> np.ndarray:
    """Times of the unified-memory CPU page faults of process `pid` inside the window."""
    if not schema.has(UM_CPU_FAULTS) or not schema.has(UM_CPU_FAULTS, con, "globalPid"):
        return np.empty(0, np.int64)
    return read_columns(
        con,
        f"SELECT start FROM {UM_CPU_FAULTS} WHERE (globalPid & {PID_MASK}) = ? AND start >= ? AND start <= ?",
        (pid, *window),
    )[0]


def page_faults(con: sqlite3.Connection, schema: Schema) -> dict[str, int]:
    out = {}
    if schema.has(UM_CPU_FAULTS):
        out["cpu"] = con.execute(f"SELECT COUNT(*) FROM {UM_CPU_FAULTS}").fetchone()[0]
    if schema.has(UM_GPU_FAULTS):
        column = "numberOfPageFaults" if schema.has(UM_GPU_FAULTS, con, "numberOfPageFaults") else "1"
        out["gpu"] = con.execute(f"SELECT COALESCE(SUM({column}), 0) FROM {UM_GPU_FAULTS}").fetchone()[0]
    return out


def launch_configs(
    con: sqlite3.Connection, schema: Schema, name_column: str, names: list[str], params: dict
) -> dict[str, int]:
    """Distinct launch configurations (grid, block, dynamic shared memory) of the kernels named
    `names` in the window: how many launches Nsight Compute profiles with one per configuration."""
    columns = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "dynamicSharedMemory")
    if not names or not all(schema.has(KERNEL, con, c) for c in columns):
        return {}
    config = " || ',' || ".join(columns)
    marks = ",".join("?" * len(names))
    return dict(
        con.execute(
            f"SELECT s.value, COUNT(DISTINCT {config}) FROM {KERNEL} k JOIN StringIds s ON s.id = k.{name_column} "
            f"WHERE k.globalPid = ? AND k.deviceId = ? AND k.start >= ? AND k.end <= ? AND s.value IN ({marks}) "
            "GROUP BY s.value",
            [params["pid"], params["dev"], params["w0"], params["w1"], *names],
        ).fetchall()
    )


def gpu_metrics(con: sqlite3.Connection, schema: Schema, window: tuple[int, int]) -> dict[str, float]:
    """The mean of each sampled GPU metric over `window` (ns), by the name nsys gives it
    (`SMs Active [Throughput %]`, `Tensor Active [Throughput %]`, `DRAM Read Bandwidth [Throughput %]`,
    ...); empty when the export holds no GPU metrics (`--gpu-metrics-devices` was not given)."""
    if not (schema.has(GPU_METRICS) and schema.has(GPU_METRICS_INFO)):
        return {}
    rows = con.execute(
        f"SELECT i.metricName, AVG(m.value) FROM {GPU_METRICS} m JOIN {GPU_METRICS_INFO} i "
        "ON m.typeId = i.typeId AND m.metricId = i.metricId "
        "WHERE m.timestamp >= ? AND m.timestamp <= ? GROUP BY i.metricName",
        window,
    )
    return {str(name): float(mean) for name, mean in rows}
