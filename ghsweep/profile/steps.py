"""The training steps of a profile, whoever made it, and which of them are warm-up.

Found, in this order:
1. Named ranges (NVTX, or the PyTorch profiler's record_function): the common conventions,
   case-insensitive, with or without separators and numbers (`step 3`, `step0`, `step_12`,
   `Step 3`, `iteration 7`, `iter7`, `Batch 3`, `train_step`, `training_step`, `ProfilerStep#4`),
   also behind a module or framework prefix (`megatron.train_step`,
   `[pl][profile]...Strategy.training_step`, `NeMo/step_5`), nested or not, on any thread. Ranges
   of one convention are one candidate; of several candidates the one covering the most time wins
   (an outer `iteration` over its inner micro-`step`s). Unnumbered ranges are numbered in time order.
2. The repeating structure of the GPU work: one burst of optimizer kernels ends each step; without
   optimizer kernels, the kernel sequence's period: the shortest L with the sequence repeating
   itself L kernels later (a kernel launched once every L kernels marks the step).
3. Neither: no steps (the caller falls back to the whole trace and says so).

Stubs: a leading or trailing step far shorter than the others (STUB_SHARE of their median) that
launched no GPU work (a profiler's last ProfilerStep opened as the loop ends) is no step: it is
dropped before warm-up is looked for (it would make every real step look slow).

Warm-up: leading steps much slower than the median of the steps after them (works from two
steps on: a capture of steps 0-1 keeps step 1 only when step 0 is the slow start-up, more than
twice as long).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

import numpy as np

STEP_NAME = re.compile(
    r"^\s*(?:\S*[.\]:/])?"  # a module or framework prefix: "megatron.", "[pl][profile]...Strategy.", "NeMo/"
    r"(?P<kind>profiler[\s_]*step|(?:run[\s_]*)?train(?:ing)?[\s_\-]*(?:step|iter(?:ation)?|batch)"
    r"|global[\s_\-]*step|step|iteration|iter|batch)(?:[\s_#:.\-]*(?P<number>\d+))?\s*$",
    re.IGNORECASE,
)
# Ranges of the optimizer's own step ("Optimizer.step#AdamW.step") are a phase, not a step; a bare
# "batch" is a data-loading range unless numbered ("Batch 3").
NOT_A_STEP = re.compile(r"optim|zero_grad", re.IGNORECASE)
NUMBER_REQUIRED = ("batch",)
# SQL LIKE filters that keep every name STEP_NAME can match (LIKE is case-insensitive in SQLite).
STEP_LIKE = ("%step%", "%iter%", "%batch%")
# A leading step this much slower than the median of the steps after it is warm-up; against one
# step alone (a capture of two) the bar is higher: a single step's time is noisier than a median.
WARMUP_FACTOR = 1.5
WARMUP_FACTOR_VS_ONE = 2.0
# Between two optimizer kernels of one burst there are at most a few other kernels (grad-norm,
# zeroing); between bursts a whole forward and backward. A gap of more other kernels than this,
# and than half the largest gap, separates two bursts.
BURST_MIN_GAP_KERNELS = 8
# A kernel marks a step when this share of the gaps between its launches is the same number of
# kernels; a period L explains the sequence when this share of its kernels recur L kernels later.
REPEAT_SHARE = 0.8
# A first or last step shorter than this share of the median step, launching no GPU work, is a stub.
STUB_SHARE = 0.1

NVTX_BASIS = "nvtx steps"
INFERRED_BASIS = "inferred steps"
WHOLE_TRACE = "whole trace"


@dataclass(frozen=True)
class Step:
    step: int
    start: int  # ns; CPU time for named ranges, GPU time for inferred steps
    end: int

    @property
    def duration(self) -> int:
        return self.end - self.start


@dataclass
class Steps:
    """The steps of a profile and how they were found."""

    all: list[Step] = field(default_factory=list)
    basis: str = WHOLE_TRACE  # NVTX_BASIS | INFERRED_BASIS | WHOLE_TRACE
    source: str = ""  # what they were found from, in words
    warmup: list[Step] = field(default_factory=list)
    steady: list[Step] = field(default_factory=list)
    warmup_reason: str = ""
    stubs: list[Step] = field(default_factory=list)  # dropped: see without_stubs
    # The first step is where a capture range started (cudaProfilerStart): warm-up whatever its length.
    capture_start: bool = False

    def __post_init__(self):
        if self.capture_start and len(self.all) > 1:
            warmup, self.steady, reason = split_warmup(self.all[1:])
            self.warmup = [self.all[0], *warmup]
            first = f"step {self.all[0].step}: the capture's first, where the profiler started"
            self.warmup_reason = f"{first}; {reason}" if reason else first
        else:
            self.warmup, self.steady, self.warmup_reason = split_warmup(self.all)


def step_kind(name: str) -> tuple[str, int | None] | None:
    """(convention, number) of a range named like a step, else None."""
    match = STEP_NAME.match(name or "")
    if not match or NOT_A_STEP.search(name):
        return None
    kind = re.sub(r"[\s_\-]", "", match.group("kind").lower())
    number = match.group("number")
    if number is None and kind in NUMBER_REQUIRED:
        return None
    return kind, int(number) if number is not None else None


def _outermost(ranges: list[tuple[int, int, int | None]]) -> list[tuple[int, int, int | None]]:
    """Ranges not inside an earlier one (the same range on two threads, or a nested repeat)."""
    kept: list[tuple[int, int, int | None]] = []
    for start, end, number in sorted(ranges, key=lambda r: (r[0], -r[1])):
        if kept and start < kept[-1][1]:
            continue
        kept.append((start, end, number))
    return kept


def from_ranges(ranges: list[tuple[str, int, int]], where: str) -> Steps | None:
    """Steps from named ranges (name, start ns, end ns); None when no range is named like a step."""
    families: dict[str, list[tuple[int, int, int | None]]] = {}
    names: dict[str, str] = {}
    for name, start, end in ranges:
        kind = step_kind(name)
        if kind is None or end is None or end <= start:
            continue
        families.setdefault(kind[0], []).append((start, end, kind[1]))
        names.setdefault(kind[0], name)
    if not families:
        return None
    best = max(families, key=lambda k: (sum(e - s for s, e, _ in _outermost(families[k])), len(families[k])))
    kept = _outermost(families[best])
    numbers = [n for _, _, n in kept if n is not None]
    numbered = len(numbers) == len(kept) and len(set(numbers)) == len(kept)
    steps = [Step(numbers[i] if numbered else i, s, e) for i, (s, e, _) in enumerate(kept)]
    return Steps(steps, NVTX_BASIS, f'{where} named like "{re.sub(r"[0-9]+", "N", names[best])}"')


def from_optimizer_bursts(start: np.ndarray, end: np.ndarray, optimizer: np.ndarray, what: str) -> Steps | None:
    """Steps of a trace without step ranges: kernels (sorted by start) with a mask of optimizer
    kernels; each burst of optimizer kernels ends a step, the first step starts with the first
    kernel. None with fewer than two bursts (nothing repeats)."""
    index = np.flatnonzero(optimizer)
    if len(index) < 2:
        return None
    between = np.diff(index) - 1
    threshold = max(BURST_MIN_GAP_KERNELS, between.max() / 2)
    last_of_burst = [*index[:-1][between > threshold].tolist(), int(index[-1])]
    if len(last_of_burst) < 2:
        return None
    steps, begin = [], int(start[0])
    for i, last in enumerate(last_of_burst):
        finish = int(end[: last + 1].max())
        steps.append(Step(i, begin, finish))
        begin = finish
    return Steps(steps, INFERRED_BASIS, f"the GPU work: one burst of optimizer kernels ({what}) per step")


def from_repeats(start: np.ndarray, end: np.ndarray, keys: np.ndarray, names: dict[int, str]) -> Steps | None:
    """Steps of a trace without step ranges or optimizer kernels: kernels (sorted by start) keyed by
    name. A kernel launched once per step recurs every L kernels (L = the kernels of a step); the
    marker with the longest such period, recurring exactly for most of the trace, ends a step at each
    launch, and the next step begins after it (of equal periods, the marker followed by the longest
    GPU idle time: the host between two steps). None when nothing recurs."""
    n = len(keys)
    if n < 2 * BURST_MIN_GAP_KERNELS:
        return None
    order = np.lexsort((np.arange(n), keys))
    first = np.r_[True, keys[order][1:] != keys[order][:-1]]
    markers = []  # (period, idle after, key)
    for group in np.split(order, np.flatnonzero(first)[1:]):
        if len(group) < 3:
            continue
        gaps = np.diff(group)
        values, counts = np.unique(gaps, return_counts=True)
        period = int(values[np.argmax(counts)])
        if period < BURST_MIN_GAP_KERNELS or counts.max() < REPEAT_SHARE * len(gaps):
            continue
        after = group[group + 1 < n]
        idle = float(np.mean(start[after + 1] - end[after])) if len(after) else 0.0
        markers.append((period, idle, int(keys[group[0]])))
    # A kernel launched once every 2L kernels (one of two alternating halves) does not make the step
    # 2L long when the whole sequence already repeats every L: the shortest explaining period wins.
    explaining = [m for m in markers if np.mean(keys[m[0] :] == keys[: -m[0]]) >= REPEAT_SHARE]
    best = min(explaining or markers, key=lambda m: (m[0], -m[1], m[2]), default=None)
    if best is None:
        return None
    marks = np.flatnonzero(keys == best[2])
    steps, begin = [], int(start[0])
    for i, mark in enumerate(marks):
        finish = int(end[: mark + 1].max())
        steps.append(Step(i, begin, finish))
        begin = finish
    return Steps(
        steps,
        INFERRED_BASIS,
        f"the GPU work: it repeats every {best[0]} kernels, one step each, ending at {names.get(best[2], best[2])}"[
            :200
        ],
    )


def without_stubs(found: Steps, launches_work) -> Steps:
    """`found` less its leading and trailing stubs (STUB_SHARE of the median step or shorter, and
    `launches_work(step)` False); at least one step stays."""
    steps = list(found.all)
    if len(steps) < 2:
        return found
    bar = STUB_SHARE * statistics.median(s.duration for s in steps)
    stubs = []
    for index in (-1, 0):
        while len(steps) > 1 and steps[index].duration < bar and not launches_work(steps[index]):
            stubs.append(steps.pop(index))
    if not stubs:
        return found
    # A capture that began in a stub still disturbs the first step with work: it stays the warm-up.
    kept = sorted(stubs, key=lambda s: s.start)
    return Steps(steps, found.basis, found.source, stubs=kept, capture_start=found.capture_start)


def split_warmup(steps: list[Step]) -> tuple[list[Step], list[Step], str]:
    """(warm-up steps, steady steps, why): leading steps slower than WARMUP_FACTOR x the median of
    the steps after them (WARMUP_FACTOR_VS_ONE x when one step follows) are warm-up; at least one
    step stays."""
    warm = 0
    while warm < len(steps) - 1:
        after = steps[warm + 1 :]
        factor = WARMUP_FACTOR if len(after) > 1 else WARMUP_FACTOR_VS_ONE
        if steps[warm].duration <= factor * statistics.median(s.duration for s in after):
            break
        warm += 1
    if not warm:
        return [], list(steps), ""
    after = steps[warm:]
    factor = WARMUP_FACTOR if len(after) > 1 else WARMUP_FACTOR_VS_ONE
    slow = ", ".join(f"step {s.step} {s.duration / 1e6:.1f} ms" for s in steps[:warm])
    return (
        steps[:warm],
        after,
        (
            f"{slow}: slower than {factor}x the median "
            f"{statistics.median(s.duration for s in after) / 1e6:.1f} ms of the "
            f"{len(after)} steps after"
        ),
    )
