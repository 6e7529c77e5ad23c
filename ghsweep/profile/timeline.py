"""Interval arithmetic over a device's operations, vectorised with numpy: busy time (union),
idle gaps, and per-name sums. Both the nsys path and the PyTorch-trace path use it.

Operations arrive as columns (start, end, type, correlation id; int64 ns). Sorted by start, the
running maximum of the previous ends says, for each operation, what it adds to the union and
whether a gap opened before it: one sort and a few vector passes, memory linear in the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KERNEL, MEMCPY, MEMSET = 0, 1, 2
# A zero-length mark at a window's edge: it adds no busy time, and opens or closes the gap next to it.
EDGE = 3


@dataclass
class Ops:
    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray  # KERNEL / MEMCPY / MEMSET
    corr: np.ndarray

    @classmethod
    def concat(cls, parts: list[Ops]) -> Ops:
        if not parts:
            empty = np.empty(0, np.int64)
            return cls(empty, empty, empty, empty)
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("start", "end", "kind", "corr")))

    def clip(self, w0: int, w1: int) -> Ops:
        keep = (self.end > w0) & (self.start < w1)
        return Ops(np.maximum(self.start[keep], w0), np.minimum(self.end[keep], w1), self.kind[keep], self.corr[keep])

    def sorted(self) -> Ops:
        order = np.lexsort((self.end, self.start))
        return Ops(self.start[order], self.end[order], self.kind[order], self.corr[order])


def _previous_end(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For intervals sorted by start: the latest end of all earlier intervals (the first: its start)."""
    prev = np.empty_like(end)
    if len(end):
        prev[0] = start[0]
        np.maximum.accumulate(end[:-1], out=prev[1:])
    return prev


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of sorted intervals (overlaps counted once)."""
    prev = _previous_end(start, end)
    return int(np.maximum(0, end - np.maximum(start, prev)).sum())


@dataclass
class Timeline:
    busy_ns: int
    kernel_union_ns: int
    kernel_or_copy_ns: int
    gap_buckets: list[tuple[int, int]]  # (count, total ns) per bucket
    gap_max_ns: int
    long_gaps: list[tuple[int, int, int]]  # (start, end, correlation id of the op ending it)


def timeline(ops: Ops, buckets: list[tuple[int, int | None]], min_gap_ns: int) -> Timeline:
    ops = ops.sorted()
    prev = _previous_end(ops.start, ops.end)
    busy = int(np.maximum(0, ops.end - np.maximum(ops.start, prev)).sum())
    k = ops.kind == KERNEL
    kc = ops.kind <= MEMCPY
    gap = ops.start - prev
    opened = gap > 0
    lengths = gap[opened]
    hist = []
    for lo, hi in buckets:
        inside = (lengths >= lo) & (lengths < hi) if hi is not None else lengths >= lo
        hist.append((int(inside.sum()), int(lengths[inside].sum())))
    long = np.flatnonzero(opened & (gap >= min_gap_ns))
    return Timeline(
        busy_ns=busy,
        kernel_union_ns=union_ns(ops.start[k], ops.end[k]),
        kernel_or_copy_ns=union_ns(ops.start[kc], ops.end[kc]),
        gap_buckets=hist,
        gap_max_ns=int(lengths.max()) if len(lengths) else 0,
        long_gaps=list(zip(prev[long].tolist(), ops.start[long].tolist(), ops.corr[long].tolist())),
    )


def group_sums(keys: np.ndarray, durations: np.ndarray, short_ns: int) -> list[tuple[int, int, int, int]]:
    """(key, total ns, count, count shorter than short_ns) per distinct key, by total descending."""
    if not len(keys):
        return []
    uniq, inverse = np.unique(keys, return_inverse=True)
    total = np.bincount(inverse, weights=durations.astype(np.float64))
    count = np.bincount(inverse)
    short = np.bincount(inverse, weights=(durations < short_ns).astype(np.float64))
    order = np.argsort(-total, kind="stable")
    return [(int(uniq[i]), int(round(total[i])), int(count[i]), int(short[i])) for i in order]
