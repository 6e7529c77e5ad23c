"""Speed and memory of the nsys analysis on a large export.

    python benchmarks/analyze_bench.py [--size-gb 1.0] [--source tests/data/profiles/clean/profile.sqlite]

Builds an export of about --size-gb by replicating the rows of a real one (every GPU, runtime,
NVTX and OS-runtime row copied again and again, shifted in time by the trace's span, with fresh
correlation ids and step numbers, so the copy is a longer run of the same program), then analyses
it in a child process pinned to 2 cores and prints wall time and peak resident memory. Target:
1 GB in <= 30 s and <= 2 GB RAM.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMED = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "NVTX_EVENTS",
    "OSRT_API",
)
CORRELATED = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
)


def grow(path: Path, size_bytes: float) -> float:
    """Append shifted copies of the timed rows of `path` (doubling, then a partial last copy of
    the trace's first part) until the file is about `size_bytes`; return the growth factor."""
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    factor = 1.0
    while path.stat().st_size < size_bytes * 0.99:
        fraction = min(1.0, size_bytes / path.stat().st_size - 1)
        span = con.execute("SELECT MAX(end) - MIN(start) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
        corr = con.execute("SELECT MAX(correlationId) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
        steps = con.execute("SELECT COUNT(*) FROM NVTX_EVENTS WHERE text LIKE 'step %'").fetchone()[0]
        for table in TIMED:
            if table not in tables:
                continue
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
            exprs = []
            for c in cols:
                if c in ("start", "end"):
                    exprs.append(f"{c} + {span}")
                elif c == "correlationId" and table in CORRELATED:
                    exprs.append(f"correlationId + {corr}")
                elif c == "text" and table == "NVTX_EVENTS":
                    exprs.append(
                        f"CASE WHEN text LIKE 'step %' THEN 'step ' || (CAST(substr(text, 6) AS INTEGER) "
                        f"+ {steps}) ELSE text END"
                    )
                else:
                    exprs.append(c)
            names = ", ".join(f'"{c}"' for c in cols)
            rows = con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
            con.execute(
                f"INSERT INTO {table} ({names}) SELECT {', '.join(exprs)} FROM {table} ORDER BY rowid "
                f"LIMIT {int(rows * fraction)}"
            )
        con.commit()
        factor *= 1 + fraction
    con.close()
    return factor


def child(path: str) -> None:
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:2]))
    sys.path.insert(0, str(REPO))
    from ghsweep.profile.run_analysis import full_analysis

    started = time.perf_counter()
    result = full_analysis(Path(path))
    print(
        json.dumps(
            {
                "seconds": time.perf_counter() - started,
                "gpu_busy_pct": result.gpu_busy_pct,
                "kernels": result.whole_trace["kernel_count"],
                "steps": len(result.window["steps"]),
                "findings": [f.id for f in result.findings],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--source", type=Path, default=REPO / "tests/data/profiles/clean/profile.sqlite")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.sqlite"
        shutil.copy(args.source, big)
        t = time.perf_counter()
        factor = grow(big, args.size_gb * 1e9)
        print(
            f"built {big.stat().st_size / 1e9:.2f} GB ({factor:.0f}x the rows of {args.source}) "
            f"in {time.perf_counter() - t:.0f} s"
        )
        proc = subprocess.run([sys.executable, __file__, "--child", str(big)], capture_output=True, text=True)
        if proc.returncode:
            sys.exit(proc.stderr)
        out = json.loads(proc.stdout)
        rss_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        print(
            f"analysed in {out['seconds']:.1f} s, peak RSS {rss_gb:.2f} GiB on 2 cores: {out['kernels']:,} kernels, "
            f"{out['steps']} steady steps, busy {out['gpu_busy_pct']:.1f}%, findings {out['findings']}"
        )


if __name__ == "__main__":
    main()
