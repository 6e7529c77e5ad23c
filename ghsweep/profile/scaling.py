"""Where the per-GPU throughput went when a combination runs on N GPUs instead of one.

With the same micro-batch per GPU, tokens/s per GPU is proportional to 1 / step time, so the
throughput lost is the step time gained. Each run's mean steady step splits exactly into
(engine.time_per_step): compute busy + exposed NCCL + idle, and compute busy = the sum of the
non-NCCL operations' time by name - their overlap across streams. The difference of the N-GPU
run's step (mean over its ranks) and the 1-GPU run's then splits, without remainder, into:

- slower compute: the same kernels (by function name, in both runs; Inductor's generated kernels
  without their per-graph index) taking longer per step,
  because NCCL kernels share the SMs and memory bandwidth beside them;
- added work: kernels and copies only the N-GPU run has (FSDP's casts and copies, bucketing), less
  those only the 1-GPU run has;
- overlap change: less (or more) compute running concurrently on several streams;
- imbalance: the time a rank waits, NCCL alone on its GPU, for the rank with the most compute
  (per rank the smaller of its compute deficit and its exposed NCCL time, mean over ranks);
- exposed communication: the rest of the NCCL time no compute hides;
- idle / launch: more time with nothing on the GPU (the host late with launches, syncs).

Every term is ms per step and traceable to kernels: `kernels` lists the names that changed most.
"""

from __future__ import annotations

import gzip
import re
import statistics
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ghsweep.core.errors import ProfileError
from ghsweep.profile.kernel_kinds import kernel_family
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.profile.run_analysis import full_analysis, rank_analysis

COMPONENTS = (
    ("slower_compute_ms", "slower compute of the same kernels"),
    ("added_work_ms", "kernels and copies only on N GPUs (less those only on 1)"),
    ("overlap_change_ms", "less compute overlapped across streams"),
    ("imbalance_ms", "imbalance: waiting for the rank with the most compute"),
    ("exposed_comm_ms", "exposed communication (NCCL with no compute beside it)"),
    ("idle_ms", "added idle / launch time (nothing on the GPU)"),
)
TOP_KERNELS = 10


def has_time_per_step(analysis: ProfileAnalysis) -> bool:
    """Whether every rank's step was split (analyses made before time_per_step existed were not)."""
    return all(row.get("time_per_step") for row in analysis.ranks) and bool(analysis.time_per_step)


def rank_steps(analysis: ProfileAnalysis) -> list[dict]:
    """Each rank's time_per_step (the analysis itself on one GPU); ProfileError without one."""
    steps = [row.get("time_per_step") or {} for row in analysis.ranks] or [analysis.time_per_step]
    if not all(s.get("step_ms") for s in steps):
        raise ProfileError("a profile analysis without time per step (made by an older ghsweep, or no device work)")
    return steps


def by_family(ms_by_name: dict[str, float]) -> dict[str, float]:
    """Time per kernel family (kernel_kinds.kernel_family): Inductor's kernels line up across runs."""
    families: dict[str, float] = {}
    for name, ms in ms_by_name.items():
        families[kernel_family(name)] = families.get(kernel_family(name), 0.0) + ms
    return families


def decompose(one: ProfileAnalysis, many: ProfileAnalysis) -> dict:
    """The step time gained from `one` (1 GPU) to `many` (N GPUs, every rank), split into
    COMPONENTS (ms per step); their sum is `difference_ms` exactly."""
    base = rank_steps(one)[0]
    ranks = rank_steps(many)

    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in ranks)

    base_by_name = by_family(base["compute_by_name_ms"])
    ranks_by_name = [by_family(r["compute_by_name_ms"]) for r in ranks]
    names = {n for r in ranks_by_name for n in r} | set(base_by_name)
    by_name = {n: statistics.fmean(r.get(n, 0.0) for r in ranks_by_name) for n in names}
    shared = [n for n in names if n in base_by_name and any(n in r for r in ranks_by_name)]
    slower = sum(by_name[n] - base_by_name[n] for n in shared)
    added = sum(by_name[n] for n in names if n not in base_by_name) - sum(
        base_by_name[n] for n in base_by_name if n not in shared
    )
    overlap_many = sum(by_name.values()) - mean("compute_busy_ms")
    overlap_one = sum(base_by_name.values()) - base["compute_busy_ms"]
    most = max(r["compute_busy_ms"] for r in ranks)
    imbalance = statistics.fmean(min(most - r["compute_busy_ms"], r["exposed_comm_ms"]) for r in ranks)
    parts = {
        "slower_compute_ms": slower,
        "added_work_ms": added,
        "overlap_change_ms": overlap_one - overlap_many,
        "imbalance_ms": imbalance,
        "exposed_comm_ms": mean("exposed_comm_ms") - imbalance - base["exposed_comm_ms"],
        "idle_ms": mean("idle_ms") - base["idle_ms"],
    }
    changed = sorted(names, key=lambda n: -abs(by_name[n] - base_by_name.get(n, 0.0)))[:TOP_KERNELS]
    return {
        "world_size": len(ranks),
        "step_1_ms": base["step_ms"],
        "step_n_ms": mean("step_ms"),
        "difference_ms": mean("step_ms") - base["step_ms"],
        "efficiency": base["step_ms"] / mean("step_ms"),
        **parts,
        "kernels": [
            {
                "name": n,
                "ms_1": base_by_name.get(n, 0.0),
                "ms_n": by_name[n],
                "delta_ms": by_name[n] - base_by_name.get(n, 0.0),
            }
            for n in changed
        ],
    }


def pairs(
    runs: Iterable[tuple[list[str], ProfileAnalysis | None]], world_keys: tuple[str, ...]
) -> list[tuple[str, dict]]:
    """(combination in words, decomposition) for every run on several GPUs whose combination (its
    overrides less `world_keys`) also ran on one GPU, both with a profile analysis."""
    profiled = [(o, a) for o, a in runs if a is not None and has_time_per_step(a)]

    def combination(overrides: list[str]) -> str:
        return " ".join(sorted(o for o in overrides if not o.startswith(world_keys)))

    single = {combination(o): a for o, a in profiled if len(a.ranks) <= 1}
    return [
        (combination(o) or "(defaults)", decompose(single[combination(o)], a))
        for o, a in profiled
        if len(a.ranks) > 1 and combination(o) in single
    ]


def table(d: dict) -> tuple[list[str], list[list[str]]]:
    """The decomposition as a table: one row per component, ms per step and share of the difference."""
    rows = [
        [words, f"{d[key]:+.2f}", f"{100 * d[key] / d['difference_ms']:.0f}%" if d["difference_ms"] else "-"]
        for key, words in COMPONENTS
    ]
    rows.append(["= step time gained (mean steady step, N GPUs - 1 GPU)", f"{d['difference_ms']:+.2f}", "100%"])
    return ["where the time went", "ms per step", "share"], rows


def headline(d: dict) -> str:
    return (
        f"{d['world_size']} GPUs: {d['step_1_ms']:.1f} -> {d['step_n_ms']:.1f} ms a step, per-GPU throughput "
        f"{100 * d['efficiency']:.0f}% of one GPU's ({d['difference_ms']:+.1f} ms per step)"
    )


def kernel_table(d: dict) -> tuple[list[str], list[list[str]]]:
    rows = [[k["name"][:70], f"{k['ms_1']:.2f}", f"{k['ms_n']:.2f}", f"{k['delta_ms']:+.2f}"] for k in d["kernels"]]
    return ["kernel or copy (most changed)", "ms/step 1 GPU", "ms/step N GPUs", "change"], rows


# A folder of captures kept as data: <combination>_<N>gpu/profile_rank<R>.sqlite.gz
# (benchmarks/scaling_profiles.py writes it).
CAPTURE_FOLDER = re.compile(r"(?P<combination>.+)_(?P<gpus>\d+)gpu")


def folder_analysis(folder: Path, into: Path) -> ProfileAnalysis:
    """The analysis of a capture folder's gzipped per-rank exports (decompressed under `into`)."""
    paths = []
    for packed in sorted(folder.glob("profile_rank*.sqlite.gz"), key=lambda p: int(re.findall(r"\d+", p.name)[-1])):
        path = into / folder.name / packed.name.removesuffix(".gz")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.decompress(packed.read_bytes()))
        paths.append(path)
    if not paths:
        raise ProfileError(f"{folder}: no profile_rank<R>.sqlite.gz in it")
    return full_analysis(paths[0]) if len(paths) == 1 else rank_analysis(paths, None, len(paths))


def folder_decompositions(data: Path) -> dict[str, dict]:
    """{combination: decomposition} for every <combination>_<N>gpu folder under `data` (N > 1)
    beside its <combination>_1gpu."""
    folders: dict[str, dict[int, Path]] = {}
    for f in data.iterdir():
        if m := CAPTURE_FOLDER.fullmatch(f.name):
            folders.setdefault(m["combination"], {})[int(m["gpus"])] = f
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for combination, by_gpus in sorted(folders.items()):
            for gpus in sorted(g for g in by_gpus if g > 1 and 1 in by_gpus):
                key = combination if gpus == max(by_gpus) else f"{combination}_{gpus}gpu"
                out[key] = decompose(folder_analysis(by_gpus[1], Path(tmp)), folder_analysis(by_gpus[gpus], Path(tmp)))
    return out
