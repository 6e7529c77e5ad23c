"""Where the per-GPU throughput went when a combination runs on N GPUs instead of one, and the
lever each part points to.

With the same micro-batch per GPU, tokens/s per GPU is proportional to 1 / step time, so the
throughput lost is the step time gained: the N-GPU run's step (mean over its ranks) against the
1-GPU run's, split without remainder into delta.PARTS (delta.py says how): the same kernels slower
beside NCCL, work only on N GPUs (FSDP's casts and copies, bucketing), overlap change, imbalance,
exposed communication, idle / launch time, the profiler's own overhead. Every term is ms per step
and traceable to kernels: `kernels` lists the names that changed most.
"""

from __future__ import annotations

import gzip
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ghsweep.core.errors import ProfileError
from ghsweep.profile import delta
from ghsweep.profile.delta import PARTS as COMPONENTS
from ghsweep.profile.delta import has_time_per_step
from ghsweep.profile.overhead import MeasuredRun
from ghsweep.profile.result import Finding, ProfileAnalysis
from ghsweep.profile.run_analysis import full_analysis, rank_analysis

# Parts named in the scale-out finding (the largest first), and the smallest worth naming (share of the difference).
PARTS_IN_FINDING = 3
PART_MIN_SHARE = 0.1
# Per-GPU throughput below this share of one GPU's is worth a warning (above it: info).
SCALE_OUT_WARN_EFFICIENCY = 0.9


def decompose(one: ProfileAnalysis, many: ProfileAnalysis) -> dict:
    """The step time gained from `one` (1 GPU) to `many` (N GPUs, every rank), split into
    COMPONENTS (ms per step); their sum is `difference_ms` exactly."""
    d = delta.step_delta(one, many)
    return {
        "world_size": max(1, len(many.ranks)),
        "step_1_ms": d["baseline_step_ms"],
        "step_n_ms": d["run_step_ms"],
        "difference_ms": d["difference_ms"],
        "efficiency": d["baseline_step_ms"] / d["run_step_ms"],
        **d["parts"],
        "by_family": d["by_family"],
        "kernels": [
            {"name": k["name"], "ms_1": k["baseline_ms"], "ms_n": k["run_ms"], "delta_ms": k["delta_ms"]}
            for k in d["kernels"]
        ],
    }


def pairs(
    runs: Iterable[tuple[list[str], ProfileAnalysis | None]], world_keys: tuple[str, ...]
) -> list[tuple[str, dict]]:
    """(combination in words, decomposition) for every run on several GPUs whose combination (its
    overrides less `world_keys`) also ran on one GPU, both with a profile analysis."""
    return [(words, d) for words, _, d in indexed_pairs(list(runs), world_keys)]


def indexed_pairs(
    runs: list[tuple[list[str], ProfileAnalysis | None]], world_keys: tuple[str, ...]
) -> list[tuple[str, tuple[int, int], dict]]:
    """pairs() with the (1-GPU, N-GPU) positions of each pair in `runs`."""
    profiled = [(i, o, a) for i, (o, a) in enumerate(runs) if a is not None and has_time_per_step(a)]

    def combination(overrides: list[str]) -> str:
        return " ".join(sorted(o for o in overrides if not o.startswith(world_keys)))

    single = {combination(o): (i, a) for i, o, a in profiled if len(a.ranks) <= 1}
    return [
        (combination(o) or "(defaults)", (single[combination(o)][0], i), decompose(single[combination(o)][1], a))
        for i, o, a in profiled
        if len(a.ranks) > 1 and combination(o) in single
    ]


def levers(d: dict, knobs: dict[str, str], one_gpu_peak_gb: float | None) -> dict[str, str]:
    """The lever each part of a decomposition points to, by the trainer's config keys (conf/backend/torch.yaml,
    conf/precision/*.yaml, conf/config.yaml); `knobs`: the run's overrides as {key: value}. A part with no
    knob (imbalance) or whose knob is already set is not listed."""
    families = {f["family"] for f in d.get("by_family", []) if f["run_ms"] > 0}
    sharded = any(f.startswith(("NCCL ReduceScatter", "NCCL AllGather")) for f in families)
    out = {}
    # The 1-GPU run trained the whole model on one GPU: a DDP replica per GPU fits as it did.
    fits = f" (the 1-GPU run trained unsharded in {one_gpu_peak_gb:.0f} GB)" if one_gpu_peak_gb else ""
    if sharded:
        out["added_work_ms"] = (
            f"backend.data_parallel=ddp{fits}: no FSDP all-gathers, casts and copies per step, "
            "but each rank then holds all the weights and steps the optimizer over them"
            if knobs.get("backend.data_parallel") != "ddp"
            else ""
        )
        if knobs.get("backend.fsdp_reshard_after_forward") == "true":
            out["added_work_ms"] = "backend.fsdp_reshard_after_forward=false: one all-gather per step instead of two"
    if "NCCL ReduceScatter f32" in families and knobs.get("precision.reduce_dtype") != "param":
        out["exposed_comm_ms"] = (
            "precision.reduce_dtype=param: gradients reduced in their own dtype, half the bytes "
            "(on more than two ranks each add rounds)"
        )
    elif sharded and knobs.get("backend.data_parallel") != "ddp":
        out["exposed_comm_ms"] = f"backend.data_parallel=ddp{fits}: one all-reduce overlapped with the backward"
    # The family is NCCL's all-gather kernels (FSDP2's, so sharded): gathers the copy engines moved leave none.
    gathered_on_sms = any(f.startswith("NCCL AllGather") for f in families)
    if gathered_on_sms and knobs.get("backend.fsdp_all_gather") != "copy_engine":
        out["slower_compute_ms"] = (
            "backend.fsdp_all_gather=copy_engine: FSDP2's all-gathers on the copy engines, off the SMs "
            "(one node's GPUs, NCCL >= 2.28; auto takes it where it works)"
        )
    else:
        out["slower_compute_ms"] = (
            "NCCL's kernels share the SMs and memory bandwidth with compute; fewer NCCL CTAs "
            "(NCCL_MAX_CTAS in the sweep's environment, or container.env in a container) trade communication "
            "speed for compute, a loss where the collectives then stop hiding behind compute"
        )
    if knobs.get("train.compile") == "false":
        out["idle_ms"] = "the host late with launches: train.compile=true launches fewer, larger kernels"
    return {k: v for k, v in out.items() if v}


def scale_out_finding(d: dict, combination: str, knobs: dict[str, str], one_gpu_peak_gb: float | None) -> Finding:
    """The scale-out finding of a run on N GPUs against its 1-GPU twin: the per-GPU throughput lost,
    its largest parts in ms per step and the lever each points to."""
    pointed = levers(d, knobs, one_gpu_peak_gb)
    words = dict(COMPONENTS)
    worth = PART_MIN_SHARE * abs(d["difference_ms"])
    largest = sorted((k for k, _ in COMPONENTS if d[k] > 0 and d[k] >= worth), key=lambda k: -d[k])[:PARTS_IN_FINDING]
    said = "; ".join(
        f"{words[k]} {d[k]:+.1f} ms" + (f" (lever: {pointed[k]})" if k in pointed else "") for k in largest
    )
    lost = 100 * (1 - d["efficiency"])
    return Finding(
        "scale_out",
        "warning" if d["efficiency"] < SCALE_OUT_WARN_EFFICIENCY else "info",
        f"on {d['world_size']} GPUs each GPU gives {100 * d['efficiency']:.0f}% of one GPU's throughput "
        f"({lost:.0f}% lost: {d['step_1_ms']:.1f} -> {d['step_n_ms']:.1f} ms a step, {d['difference_ms']:+.1f} ms)"
        + (f"; largest parts: {said}" if said else ""),
        {
            "combination": combination,
            "efficiency": d["efficiency"],
            "difference_ms": d["difference_ms"],
            **{k: d[k] for k, _ in COMPONENTS},
            "levers": pointed,
        },
    )


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
    """The analysis of a capture folder's gzipped per-rank exports (decompressed under `into`), with
    the run's measured step where the folder keeps its summary.json: the profiler's own overhead is
    then a part of the decomposition, as in the sweep's report, not left in its idle time."""
    paths = []
    for packed in sorted(folder.glob("profile_rank*.sqlite.gz"), key=lambda p: int(re.findall(r"\d+", p.name)[-1])):
        path = into / folder.name / packed.name.removesuffix(".gz")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.decompress(packed.read_bytes()))
        paths.append(path)
    if not paths:
        raise ProfileError(f"{folder}: no profile_rank<R>.sqlite.gz in it")
    measured = MeasuredRun.of(folder)
    if len(paths) == 1:
        return full_analysis(paths[0], measured=measured)
    return rank_analysis(paths, None, len(paths), measured=measured)


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
