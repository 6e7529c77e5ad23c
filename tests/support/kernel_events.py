"""Ground truth for analysis tests: kernel time summed straight from an nsys SQLite export."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path


def kernel_ms_per_step(path: Path, window: dict, steps: int, key: Callable[[str], str]) -> dict[str, float]:
    """Kernel time per step inside the window (each kernel clipped to it), summed by `key` of its name."""
    con = sqlite3.connect(path)
    rows = con.execute(
        "SELECT s.value, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
        "WHERE k.end > ? AND k.start < ?",
        (window["start_ns"], window["end_ns"]),
    ).fetchall()
    con.close()
    out: dict[str, float] = {}
    for name, start, end in rows:
        clipped = min(end, window["end_ns"]) - max(start, window["start_ns"])
        out[key(name)] = out.get(key(name), 0.0) + clipped / steps / 1e6
    return out
