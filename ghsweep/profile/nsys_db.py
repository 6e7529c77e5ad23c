"""Reading an Nsight Systems SQLite export with SQL aggregation.

The big tables (kernels, memcpy, memset, runtime API calls) are read once each, streamed in chunks
into int64 numpy columns (never one Python object per row): unions, gaps and per-name sums are
vector operations on them (timeline.py). Selective lookups (step ranges, OS waits, copy groups)
are SQL aggregations or filtered queries, and only small results come back as rows.

Tables appear only when their data was captured, and columns change across nsys versions, so
every query first checks what the export has.
"""

from __future__ import annotations

import re
import sqlite3
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ghsweep.profile import timeline

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"
OSRT = "OSRT_API"
UM_CPU_FAULTS = "CUDA_UM_CPU_PAGE_FAULT_EVENTS"
UM_GPU_FAULTS = "CUDA_UM_GPU_PAGE_FAULT_EVENTS"

# NVTX_EVENTS.eventType of a push/pop range (59) and a start/end range (60).
NVTX_RANGE_TYPES = (59, 60)
STEP_RANGE = re.compile(r"^step (\d+)$")
# A leading step this much slower than the median of the captured steps is warm-up.
WARMUP_FACTOR = 1.5
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


@dataclass(frozen=True)
class Step:
    step: int
    start: int  # CPU time of the NVTX range, ns
    end: int

    @property
    def duration(self) -> int:
        return self.end - self.start


def step_ranges(con: sqlite3.Connection, schema: Schema) -> list[Step]:
    """The NVTX "step N" ranges, in time order (text inline or through StringIds)."""
    if not schema.has(NVTX):
        return []
    name = "e.text"
    join = ""
    if schema.has(NVTX, con, "textId") and schema.has("StringIds"):
        name = "COALESCE(e.text, s.value)"
        join = "LEFT JOIN StringIds s ON s.id = e.textId"
    rows = con.execute(
        f"SELECT {name}, e.start, e.end FROM {NVTX} e {join} "
        f"WHERE e.eventType IN {NVTX_RANGE_TYPES} AND e.end IS NOT NULL AND {name} LIKE 'step %' "
        "ORDER BY e.start"
    ).fetchall()
    steps = []
    for text, start, end in rows:
        match = STEP_RANGE.match(text or "")
        if match:
            steps.append(Step(int(match.group(1)), start, end))
    return steps


def split_warmup(steps: list[Step]) -> tuple[list[Step], list[Step]]:
    """(warm-up steps, steady steps): leading steps much slower than the median are warm-up."""
    if len(steps) < 3:
        return [], steps
    median = statistics.median(s.duration for s in steps)
    warm = 0
    while warm < len(steps) - 2 and steps[warm].duration > WARMUP_FACTOR * median:
        warm += 1
    return steps[:warm], steps[warm:]


def kernel_name_column(con: sqlite3.Connection, schema: Schema, column: str) -> str:
    return column if schema.has(KERNEL, con, column) else "demangledName"


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
    return cols


def main_process_device(kernels: Table) -> tuple[int | None, int | None]:
    """(globalPid, deviceId) that ran the most kernel time: the trainer on its GPU, not helpers."""
    if not len(kernels):
        return None, None
    dur = kernels["end"] - kernels["start"]
    pairs, inverse = np.unique(np.stack([kernels["pid"], kernels["dev"]], axis=1), axis=0, return_inverse=True)
    best = int(np.argmax(np.bincount(inverse.ravel(), weights=dur.astype(np.float64))))
    return int(pairs[best][0]), int(pairs[best][1])


def gpu_window(con: sqlite3.Connection, schema: Schema, gpu: list[Table], steps: list[Step], pid: int,
               device: int) -> tuple[int, int] | None:
    """The GPU time span of the work launched inside `steps` (NVTX ranges projected on the GPU).

    NVTX ranges are CPU times; the GPU runs behind the CPU, and at the start of a capture it is
    still busy with work launched before the capture (which is not traced). So the window starts
    at the first GPU operation launched in the first step and ends at the end of the last one
    launched in the last step. CUDA correlation ids grow with launch order within a process.
    """
    if not steps or not schema.has(RUNTIME):
        return None
    lo, hi = con.execute(
        f"SELECT MIN(CASE WHEN start >= ? THEN correlationId END), "
        f"MAX(CASE WHEN start <= ? THEN correlationId END) FROM {RUNTIME} WHERE (globalTid & {PID_MASK}) = ?",
        (steps[0].start, steps[-1].end, pid),
    ).fetchone()
    if lo is None or hi is None:
        return None
    starts, ends = [], []
    for t in gpu:
        inside = (t["pid"] == pid) & (t["dev"] == device) & (t["corr"] >= lo) & (t["corr"] <= hi)
        if inside.any():
            starts.append(t["start"][inside].min())
            ends.append(t["end"][inside].max())
    return (int(min(starts)), int(max(ends))) if starts else None


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
            "short_name": names.get(first.get(key), str(first.get(key))),
            "total_ns": total,
            "count": count,
            "mean_ns": total / count,
            "pct": 100.0 * total / all_total if all_total else 0.0,
        }
        for key, total, count, _ in groups
    ]
    return {"ranked": ranked, "count": len(dur), "total_ns": all_total, "short": sum(g[3] for g in groups)}


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
    """StringIds ids whose value is one of `patterns` (SQL LIKE), e.g. 'cudaStreamSynchronize%'."""
    clause = " OR ".join("value LIKE ?" for _ in patterns)
    return [r[0] for r in con.execute(f"SELECT id FROM StringIds WHERE {clause}", patterns)]


def process_intervals(con: sqlite3.Connection, table: str, pid: int, name_ids: list[int], window: tuple[int, int]
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


def call_time(con: sqlite3.Connection, table: str, pid: int, name_ids: list[int], window: tuple[int, int]) -> int:
    """Total duration of the calls named by `name_ids` in process `pid` inside the window."""
    if not name_ids:
        return 0
    marks = ",".join("?" * len(name_ids))
    return con.execute(
        f"SELECT COALESCE(SUM(end - start), 0) FROM {table} WHERE (globalTid & {PID_MASK}) = ? "
        f"AND nameId IN ({marks}) AND end > ? AND start < ?",
        [pid, *name_ids, *window],
    ).fetchone()[0]


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


def nvtx_intervals(con: sqlite3.Connection, schema: Schema, pid: int | None, like: str, window: tuple[int, int]
                   ) -> list[tuple[str, int, int]]:
    """NVTX push/pop or start/end ranges of process `pid` whose name is LIKE `like`, overlapping
    `window` (CPU time)."""
    if not schema.has(NVTX):
        return []
    name = "e.text"
    join = ""
    if schema.has(NVTX, con, "textId") and schema.has("StringIds"):
        name, join = "COALESCE(e.text, s.value)", "LEFT JOIN StringIds s ON s.id = e.textId"
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
        out.update({k: v for k, v in con.execute(
            "SELECT name, value FROM META_DATA_EXPORT WHERE name IN ('EXPORT_PRODUCT_VERSION', 'EXPORT_SCHEMA_VERSION')")})
    if schema.has("META_DATA_CAPTURE"):
        out["traced"] = sorted(v for (v,) in con.execute(
            "SELECT value FROM META_DATA_CAPTURE WHERE name = 'CAPTURE_EVENT_TYPE'"))
    if schema.has("TARGET_INFO_GPU"):
        row = con.execute("SELECT name, memoryBandwidth, smCount FROM TARGET_INFO_GPU ORDER BY id LIMIT 1").fetchone()
        if row:
            out.update(gpu_name=row[0], gpu_memory_bandwidth=row[1], gpu_sm_count=row[2])
    return out


def page_faults(con: sqlite3.Connection, schema: Schema) -> dict[str, int]:
    out = {}
    if schema.has(UM_CPU_FAULTS):
        out["cpu"] = con.execute(f"SELECT COUNT(*) FROM {UM_CPU_FAULTS}").fetchone()[0]
    if schema.has(UM_GPU_FAULTS):
        column = "numberOfPageFaults" if schema.has(UM_GPU_FAULTS, con, "numberOfPageFaults") else "1"
        out["gpu"] = con.execute(f"SELECT COALESCE(SUM({column}), 0) FROM {UM_GPU_FAULTS}").fetchone()[0]
    return out
