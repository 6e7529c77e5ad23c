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


def main_process(con: sqlite3.Connection, schema: Schema) -> int | None:
    """globalPid of the process that ran the most kernel time (the trainer, not helpers)."""
    if not schema.has(KERNEL):
        return None
    row = con.execute(
        f"SELECT globalPid FROM {KERNEL} GROUP BY globalPid ORDER BY SUM(end - start) DESC LIMIT 1"
    ).fetchone()
    return row[0] if row else None


def main_device(con: sqlite3.Connection, schema: Schema, pid: int | None) -> int | None:
    if not schema.has(KERNEL) or pid is None:
        return None
    row = con.execute(
        f"SELECT deviceId FROM {KERNEL} WHERE globalPid = ? GROUP BY deviceId ORDER BY SUM(end - start) DESC LIMIT 1",
        (pid,),
    ).fetchone()
    return row[0] if row else None


def launch_thread(con: sqlite3.Connection, schema: Schema, pid: int | None) -> int | None:
    """globalTid of the thread that made the most CUDA API calls in the main process."""
    if not schema.has(RUNTIME) or pid is None:
        return None
    row = con.execute(
        f"SELECT globalTid FROM {RUNTIME} WHERE (globalTid & {PID_MASK}) = ? "
        "GROUP BY globalTid ORDER BY COUNT(*) DESC LIMIT 1",
        (pid,),
    ).fetchone()
    return row[0] if row else None


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


def top_kernels(con: sqlite3.Connection, schema: Schema, window: tuple[int, int] | None, device: int | None,
                limit: int | None = 5, by: str = "demangledName") -> list[dict]:
    """Kernels grouped by name, by total time inside `window` (None: the whole trace)."""
    if not schema.has(KERNEL):
        return []
    column = kernel_name_column(con, schema, by)
    where, args = [], []
    if window:
        where.append("k.start >= ? AND k.end <= ?")
        args += list(window)
    if device is not None:
        where.append("k.deviceId = ?")
        args.append(device)
    clause = ("WHERE " + " AND ".join(where)) if where else ""
    rows = con.execute(
        f"SELECT k.{column}, SUM(k.end - k.start) AS total, COUNT(*), MIN(k.shortName) FROM {KERNEL} k {clause} "
        f"GROUP BY k.{column} ORDER BY total DESC" + (f" LIMIT {int(limit)}" if limit else ""),
        args,
    ).fetchall()
    all_total = con.execute(f"SELECT SUM(k.end - k.start) FROM {KERNEL} k {clause}", args).fetchone()[0] or 0
    ids = {r[0] for r in rows} | {r[3] for r in rows}
    names = string_values(con, ids)
    return [
        {
            "name": names.get(name_id, str(name_id)),
            "short_name": names.get(short_id, str(short_id)),
            "total_ns": total,
            "count": count,
            "mean_ns": total / count,
            "pct": 100.0 * total / all_total if all_total else 0.0,
        }
        for name_id, total, count, short_id in rows
    ]


def string_values(con: sqlite3.Connection, ids) -> dict[int, str]:
    ids = [i for i in ids if i is not None]
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    return dict(con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", ids).fetchall())
