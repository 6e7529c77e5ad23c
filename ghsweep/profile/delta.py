"""Where the step time went between any two profiled runs: `python -m ghsweep.analyze RUN --against
BASELINE`, the sweep comparison's "Because" line and its kernels table, and (1 GPU against N) the
Scaling section (scaling.py).

Each run's mean steady step splits exactly (engine.time_per_step, per rank; a run on several GPUs
is the mean over its ranks) into compute busy + exposed communication + idle, and compute busy = the
sum of the time by name of the operations that are not communication - their overlap across streams.
Communication is NCCL's kernels and the peer-to-peer copies of its copy-engine collectives
(kernel_kinds.is_communication). The difference of the two runs' steps then splits, without
remainder, into PARTS (ms per step, run - baseline):

- slower_compute: the same kernels (by function name; Inductor's generated kernels without their
  per-graph index, kernel_kinds.kernel_family) taking longer (+) or shorter (-);
- added_work: kernels and copies only this run has, less those only the baseline has (fp8's GEMMs
  replacing bf16's, FSDP's copies);
- overlap_change: less (+) or more (-) compute running concurrently on several streams;
- imbalance: the time a rank waits, NCCL alone on its GPU, for the rank with the most compute
  (per rank the smaller of its compute deficit and its exposed NCCL time, mean over ranks);
- exposed_comm: the rest of the communication no compute hides;
- idle: time with nothing on the GPU (the host late with launches, syncs), less the part below;
- profiler_overhead: how much more the profiler slowed this run's traced steps than the
  baseline's (profiled step - measured step of each; 0 unless both runs' measured steps are known).
  The difference less this part is the measured (untraced) step difference.

`by_family` tells the same kernel time by family (kernel_kinds.step_family: bf16 / fp8 GEMMs,
attention, fused elementwise / casts, optimizer, each NCCL collective, peer-to-peer copies, copies,
other), so runs whose kernels have other generated names still line up. Family times are summed
kernel time, so they need not add up to the difference (overlap and idle are not kernels); the parts do.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ghsweep.core.errors import ProfileError
from ghsweep.profile.kernel_kinds import kernel_family, step_family
from ghsweep.profile.result import ProfileAnalysis

PARTS = (
    ("slower_compute_ms", "the same kernels slower (+) or faster (-)"),
    ("added_work_ms", "kernels and copies only in one run (this run's less the baseline's)"),
    ("overlap_change_ms", "less (+) or more (-) compute overlapped across streams"),
    ("imbalance_ms", "imbalance: waiting for the rank with the most compute"),
    ("exposed_comm_ms", "exposed communication (NCCL with no compute beside it)"),
    ("idle_ms", "idle / launch time (nothing on the GPU)"),
    ("profiler_overhead_ms", "the profiler's own overhead (profiled - measured step)"),
)
TOP_KERNELS = 10
OTHER_BLOCKS = (
    "The two runs' captured steps trained other blocks (another seed, data or number of ranks): attention's time, "
    "and that of any kernel whose work depends on the documents, moved with the data as well as with the change."
)
FAMILIES_IN_WORDS = 3  # families named in because()


def has_time_per_step(analysis: ProfileAnalysis) -> bool:
    """Whether every rank's step was split (analyses made before time_per_step existed were not)."""
    return all(row.get("time_per_step") for row in analysis.ranks) and bool(analysis.time_per_step)


def rank_steps(analysis: ProfileAnalysis) -> list[dict]:
    """Each rank's time_per_step (the analysis itself on one GPU); ProfileError without one."""
    steps = [row.get("time_per_step") or {} for row in analysis.ranks] or [analysis.time_per_step]
    if not all(s.get("step_ms") for s in steps):
        raise ProfileError("a profile analysis without time per step (made by an older ghsweep, or no device work)")
    return steps


@dataclass
class Side:
    """One run's mean steady step, its terms averaged over its ranks."""

    step_ms: float
    compute_busy_ms: float
    exposed_comm_ms: float
    idle_ms: float
    imbalance_ms: float
    compute_ms: dict[str, float]  # by kernel_family, not communication
    comm_ms: dict[str, float]  # by name of NCCL kernel or peer-to-peer copy
    overhead_ms: float | None  # profiled - measured step; None: the measured step is unknown

    @classmethod
    def of(cls, analysis: ProfileAnalysis) -> Side:
        ranks = rank_steps(analysis)

        def mean(key: str) -> float:
            return statistics.fmean(r[key] for r in ranks)

        def mean_by(rows: list[dict[str, float]]) -> dict[str, float]:
            keys = {k for row in rows for k in row}
            return {k: statistics.fmean(row.get(k, 0.0) for row in rows) for k in keys}

        most = max(r["compute_busy_ms"] for r in ranks)
        families = [by_kernel_family(r["compute_by_name_ms"]) for r in ranks]
        # Analyses made before comm_by_name_ms existed: their NCCL time under one name.
        comm = [r.get("comm_by_name_ms", {"NCCL": r.get("comm_ms", 0.0)} if r.get("comm_ms") else {}) for r in ranks]
        overhead = (
            analysis.profiled_step_ms - analysis.measured_step_ms
            if analysis.profiled_step_ms is not None and analysis.measured_step_ms is not None
            else None
        )
        return cls(
            step_ms=mean("step_ms"),
            compute_busy_ms=mean("compute_busy_ms"),
            exposed_comm_ms=mean("exposed_comm_ms"),
            idle_ms=mean("idle_ms"),
            imbalance_ms=statistics.fmean(min(most - r["compute_busy_ms"], r["exposed_comm_ms"]) for r in ranks),
            compute_ms=mean_by(families),
            comm_ms=mean_by(comm),
            overhead_ms=overhead,
        )

    @property
    def overlap_ms(self) -> float:
        return sum(self.compute_ms[n] for n in sorted(self.compute_ms)) - self.compute_busy_ms


def by_kernel_family(ms_by_name: dict[str, float]) -> dict[str, float]:
    """Time per kernel_family: Inductor's kernels line up across runs."""
    out: dict[str, float] = {}
    for name, ms in ms_by_name.items():
        out[kernel_family(name)] = out.get(kernel_family(name), 0.0) + ms
    return out


def step_delta(baseline: ProfileAnalysis, run: ProfileAnalysis) -> dict:
    """`run`'s mean steady step against `baseline`'s: difference_ms, its PARTS (summing to it
    exactly), by_family and the kernels that changed most, all in ms per step."""
    b, r = Side.of(baseline), Side.of(run)
    # Sorted: a sum in a fixed order is the same to the last bit in every process.
    shared = sorted(set(b.compute_ms) & set(r.compute_ms))
    only = sorted(set(b.compute_ms) ^ set(r.compute_ms))
    overhead = r.overhead_ms - b.overhead_ms if r.overhead_ms is not None and b.overhead_ms is not None else 0.0
    parts = {
        "slower_compute_ms": sum(r.compute_ms[n] - b.compute_ms[n] for n in shared),
        "added_work_ms": sum(r.compute_ms[n] for n in only if n in r.compute_ms)
        - sum(b.compute_ms[n] for n in only if n in b.compute_ms),
        "overlap_change_ms": b.overlap_ms - r.overlap_ms,
        "imbalance_ms": r.imbalance_ms - b.imbalance_ms,
        "exposed_comm_ms": (r.exposed_comm_ms - r.imbalance_ms) - (b.exposed_comm_ms - b.imbalance_ms),
        "idle_ms": r.idle_ms - b.idle_ms - overhead,
        "profiler_overhead_ms": overhead,
    }
    both = {**b.compute_ms, **b.comm_ms}, {**r.compute_ms, **r.comm_ms}
    kernels: list[dict[str, Any]] = [
        {
            "name": n,
            "family": step_family(n),
            "baseline_ms": both[0].get(n, 0.0),
            "run_ms": both[1].get(n, 0.0),
            "delta_ms": both[1].get(n, 0.0) - both[0].get(n, 0.0),
        }
        for n in sorted(set(both[0]) | set(both[1]))
    ]
    kernels.sort(key=lambda k: (-abs(k["delta_ms"]), k["name"]))
    families: dict[str, dict[str, Any]] = {}
    for k in kernels:
        row = families.setdefault(k["family"], {"family": k["family"], "baseline_ms": 0.0, "run_ms": 0.0})
        row["baseline_ms"] += k["baseline_ms"]
        row["run_ms"] += k["run_ms"]
    for row in families.values():
        row["delta_ms"] = row["run_ms"] - row["baseline_ms"]
    measured = (
        {"measured_difference_ms": r.step_ms - r.overhead_ms - (b.step_ms - b.overhead_ms)}
        if r.overhead_ms is not None and b.overhead_ms is not None
        else {}
    )
    blocks = baseline.captured_blocks, run.captured_blocks
    return {
        "baseline_step_ms": b.step_ms,
        "run_step_ms": r.step_ms,
        "difference_ms": r.step_ms - b.step_ms,
        **measured,
        # Whether both runs profiled the same blocks; None where a run does not say (another backend, older runs).
        "same_blocks": blocks[0] == blocks[1] if None not in blocks else None,
        "parts": parts,
        "by_family": sorted(families.values(), key=lambda f: (-abs(f["delta_ms"]), f["family"])),
        "kernels": kernels[:TOP_KERNELS],
    }


def because(d: dict, families: int = FAMILIES_IN_WORDS) -> str:
    """The families whose time per step changed most, in words: `bf16 GEMMs -141.2 ms, fp8 GEMMs +73.0 ms`;
    a change under a millisecond (a small model's step) in microseconds, one that rounds to none left out.

    A family's time counts its kernels and copies whether or not they ran beside other work: offloaded
    activations' copies hidden behind the forward are copies' time but not step time. So where the
    overlap across streams changed by a tenth of the largest change or more, it is named too (`copies
    -77.9 ms, less overlap across streams +75.0 ms`), and the line adds up to about the step's change."""
    named = [f for f in d["by_family"][:families] if round(1000 * f["delta_ms"])]
    words = [
        f"{f['family']} {signed_time(f['delta_ms'])}"
        + (" (other blocks profiled)" if f["family"] == "attention" and d.get("same_blocks") is False else "")
        for f in named
    ]
    overlap = d.get("parts", {}).get("overlap_change_ms", 0.0)
    largest = max((abs(f["delta_ms"]) for f in named), default=0.0)
    if abs(overlap) >= max(1.0, largest / 10):
        words.append(f"{'less' if overlap > 0 else 'more'} overlap across streams {signed_time(overlap)}")
    return ", ".join(words)


def signed_time(ms: float) -> str:
    """`+73.0 ms`, or `-412 µs` under a millisecond."""
    return f"{ms:+.1f} ms" if abs(ms) >= 0.95 else f"{1000 * ms:+.0f} µs"


def headline(d: dict) -> str:
    measured = f"; measured untraced, {d['measured_difference_ms']:+.1f} ms" if "measured_difference_ms" in d else ""
    return (
        f"{d['baseline_step_ms']:.1f} -> {d['run_step_ms']:.1f} ms a profiled step "
        f"({d['difference_ms']:+.1f} ms against the baseline{measured})"
    )


def parts_table(d: dict) -> tuple[list[str], list[list[str]]]:
    """One row per part, ms per step and share of the difference, and their sum."""
    diff = d["difference_ms"]
    rows = [
        [words, f"{d['parts'][key]:+.2f}", f"{100 * d['parts'][key] / diff:.0f}%" if diff else "-"]
        for key, words in PARTS
    ]
    rows.append(["= step time difference (mean steady step, this run - baseline)", f"{diff:+.2f}", "100%"])
    return ["where the time went", "ms per step", "share"], rows


def family_table(d: dict) -> tuple[list[str], list[list[str]]]:
    rows = [
        [f["family"], f"{f['baseline_ms']:.2f}", f"{f['run_ms']:.2f}", f"{f['delta_ms']:+.2f}"] for f in d["by_family"]
    ]
    return ["kernel family", "baseline ms/step", "this run ms/step", "change"], rows


def kernel_table(d: dict) -> tuple[list[str], list[list[str]]]:
    rows = [
        [k["name"][:70], k["family"], f"{k['baseline_ms']:.2f}", f"{k['run_ms']:.2f}", f"{k['delta_ms']:+.2f}"]
        for k in d["kernels"]
    ]
    return ["kernel or copy (most changed)", "family", "baseline ms/step", "this run ms/step", "change"], rows


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def render(d: dict) -> str:
    """The step delta as text (`python -m ghsweep.analyze RUN --against BASELINE`)."""
    lines = ["# Against the baseline", "", headline(d), ""]
    if because(d):
        lines += [f"Because, per step: {because(d)}.", ""]
    if d.get("same_blocks") is False:
        lines += [OTHER_BLOCKS, ""]
    lines += markdown_table(*parts_table(d)) + [""]
    lines += markdown_table(*family_table(d)) + [""]
    lines += markdown_table(*kernel_table(d))
    return "\n".join(lines) + "\n"
