"""Reading an Nsight Systems SQLite export with SQL aggregation.

The big tables (kernels, memcpy, runtime API calls, OS runtime calls) are never loaded into
Python objects: sums, unions and gaps are computed by SQLite (window functions over the rows
sorted by start), and only small results (per-kernel sums, gaps, step ranges) come back.

Tables appear only when their data was captured, and columns change across nsys versions, so
every query first checks what the export has.
"""

from __future__ import annotations

import re
import sqlite3
import statistics
from dataclasses import dataclass, field
from pathlib import Path

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


def main_process_device(con: sqlite3.Connection, schema: Schema) -> tuple[int | None, int | None]:
    """(globalPid, deviceId) that ran the most kernel time: the trainer on its GPU, not helpers."""
    if not schema.has(KERNEL):
        return None, None
    row = con.execute(
        f"SELECT globalPid, deviceId FROM {KERNEL} GROUP BY globalPid, deviceId ORDER BY SUM(end - start) DESC LIMIT 1"
    ).fetchone()
    return (row[0], row[1]) if row else (None, None)


def gpu_tables(schema: Schema) -> list[str]:
    return [t for t in (KERNEL, MEMCPY, MEMSET) if schema.has(t)]


def gpu_window(con: sqlite3.Connection, schema: Schema, steps: list[Step], pid: int, device: int) -> tuple[int, int] | None:
    """The GPU time span of the work launched inside `steps` (NVTX ranges projected on the GPU).

    NVTX ranges are CPU times; the GPU runs behind the CPU, and at the start of a capture it is
    still busy with work launched before the capture (which is not traced). So the window starts
    at the first GPU operation launched in the first step and ends at the end of the last one
    launched in the last step. CUDA correlation ids grow with launch order within a process.
    """
    if not steps or not schema.has(RUNTIME):
        return None
    first, last = steps[0].start, steps[-1].end
    lo, hi = con.execute(
        f"SELECT MIN(CASE WHEN start >= ? THEN correlationId END), "
        f"MAX(CASE WHEN start <= ? THEN correlationId END) FROM {RUNTIME} WHERE (globalTid & {PID_MASK}) = ?",
        (first, last, pid),
    ).fetchone()
    if lo is None or hi is None:
        return None
    starts, ends = [], []
    for table in gpu_tables(schema):
        s, e = con.execute(
            f"SELECT MIN(start), MAX(end) FROM {table} "
            "WHERE globalPid = ? AND deviceId = ? AND correlationId BETWEEN ? AND ?",
            (pid, device, lo, hi),
        ).fetchone()
        if s is not None:
            starts.append(s)
            ends.append(e)
    if not starts:
        return None
    return min(starts), max(ends)


def kernel_name_column(con: sqlite3.Connection, schema: Schema, column: str) -> str:
    return column if schema.has(KERNEL, con, column) else "demangledName"


def kernel_groups(con: sqlite3.Connection, schema: Schema, window: tuple[int, int] | None, device: int | None,
                  by: str = "demangledName") -> dict:
    """Kernels grouped by name inside `window` (None: the whole trace), in one pass: the ranked
    list (name, total_ns, count, mean_ns, pct of kernel time), totals, and kernels < 10 us."""
    if not schema.has(KERNEL):
        return {"ranked": [], "count": 0, "total_ns": 0, "short": 0}
    column = kernel_name_column(con, schema, by)
    where, args = [], []
    if window:
        where.append("start >= ? AND end <= ?")
        args += list(window)
    if device is not None:
        where.append("deviceId = ?")
        args.append(device)
    clause = ("WHERE " + " AND ".join(where)) if where else ""
    rows = con.execute(
        f"SELECT {column}, SUM(end - start) AS total, COUNT(*), MIN(shortName), SUM(end - start < {SHORT_KERNEL_NS}) "
        f"FROM {KERNEL} {clause} GROUP BY {column} ORDER BY total DESC",
        args,
    ).fetchall()
    all_total = sum(r[1] for r in rows)
    names = string_values(con, {r[0] for r in rows} | {r[3] for r in rows})
    ranked = [
        {
            "name": names.get(name_id, str(name_id)),
            "short_name": names.get(short_id, str(short_id)),
            "total_ns": total,
            "count": count,
            "mean_ns": total / count,
            "pct": 100.0 * total / all_total if all_total else 0.0,
        }
        for name_id, total, count, short_id, _ in rows
    ]
    return {"ranked": ranked, "count": sum(r[2] for r in rows), "total_ns": all_total,
            "short": sum(r[4] for r in rows)}


def top_kernels(con: sqlite3.Connection, schema: Schema, window: tuple[int, int] | None, device: int | None,
                limit: int | None = 5) -> list[dict]:
    ranked = kernel_groups(con, schema, window, device)["ranked"]
    return ranked[:limit] if limit else ranked


# A kernel shorter than this does too little work to hide its launch.
SHORT_KERNEL_NS = 10_000


def string_values(con: sqlite3.Connection, ids) -> dict[int, str]:
    ids = [i for i in ids if i is not None]
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    return dict(con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", ids).fetchall())


def _ops(tables: list[str], corr: bool = False) -> str:
    """Every GPU operation of the main process and device, clipped to the window :w0..:w1, with its
    type t (0 kernel, 1 memcpy, 2 memset)."""
    kinds = {KERNEL: 0, MEMCPY: 1, MEMSET: 2}
    extra = ", correlationId AS c" if corr else ""
    return " UNION ALL ".join(
        f"SELECT MAX(start, :w0) AS s, MIN(end, :w1) AS e, {kinds[t]} AS t{extra} FROM {t} "
        "WHERE globalPid = :pid AND deviceId = :dev AND end > :w0 AND start < :w1"
        for t in tables
    )


# Over intervals sorted by start, `pa` is the latest end before this one: what sticks out past it
# is new busy time, and a start after it opens a gap. One sort in SQLite, no rows in Python.
_WINDOW = "WINDOW win AS (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)"


def timeline(con: sqlite3.Connection, tables: list[str], params: dict, buckets) -> dict:
    """Unions (all operations; kernels; kernels or copies) and idle-gap counts and sums per bucket
    ((lo, hi) ns, hi None = open), all in one pass over the operations sorted by start."""
    if not tables:
        return {"busy_ns": 0, "kernel_union_ns": 0, "kernel_or_copy_ns": 0, "gap_max_ns": 0,
                "buckets": [(0, 0) for _ in buckets]}
    gap = "(s > pa AND s - pa >= {lo}{hi})"
    cols = []
    for lo, hi in buckets:
        cond = gap.format(lo=lo, hi=f" AND s - pa < {hi}" if hi else "")
        cols += [f"SUM({cond})", f"SUM(CASE WHEN {cond} THEN s - pa ELSE 0 END)"]
    row = con.execute(
        "SELECT SUM(MAX(0, e - MAX(s, COALESCE(pa, s)))), "
        "SUM(CASE WHEN t = 0 THEN MAX(0, e - MAX(s, COALESCE(pk, s))) ELSE 0 END), "
        "SUM(CASE WHEN t <= 1 THEN MAX(0, e - MAX(s, COALESCE(pkc, s))) ELSE 0 END), "
        f"MAX(CASE WHEN s > pa THEN s - pa END), {', '.join(cols)} FROM ("
        "SELECT s, e, t, MAX(e) OVER win AS pa, MAX(CASE WHEN t = 0 THEN e END) OVER win AS pk, "
        f"MAX(CASE WHEN t <= 1 THEN e END) OVER win AS pkc FROM ({_ops(tables)}) {_WINDOW})",
        params,
    ).fetchone()
    values = [v or 0 for v in row]
    return {"busy_ns": values[0], "kernel_union_ns": values[1], "kernel_or_copy_ns": values[2],
            "gap_max_ns": values[3], "buckets": list(zip(values[4::2], values[5::2]))}


def long_gaps(con: sqlite3.Connection, tables: list[str], params: dict, min_ns: int) -> list[tuple[int, int, int]]:
    """Idle gaps of at least `min_ns`: (start, end, correlation id of the operation that ends it)."""
    if not tables:
        return []
    return con.execute(
        f"SELECT pa, s, c FROM (SELECT s, e, c, MAX(e) OVER win AS pa FROM ({_ops(tables, corr=True)}) {_WINDOW}) "
        "WHERE s - pa >= :min_gap ORDER BY s",
        params | {"min_gap": min_ns},
    ).fetchall()


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
