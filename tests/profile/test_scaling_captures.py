"""The scaling decomposition on captures kept as data: benchmarks/scaling_profiles.py turns a
sweep's nsys exports (1 and N GPUs) into trimmed, gzipped test data and the decomposition; checked
here on a planted sweep, and on the real two-GPU capture in SCALING_DATA."""

from __future__ import annotations

import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ghsweep.core.run_dir import SUMMARY
from ghsweep.core.run_result import RunResult
from ghsweep.profile import kernel_kinds
from ghsweep.profile.run_analysis import full_analysis
from ghsweep.profile.scaling import (
    CAPTURE_FOLDER,
    COMPONENTS,
    folder_analysis,
    folder_decompositions,
    scale_out_finding,
)
from tests.profile.planted import ONE, RANKS, planted_rank, write_nsys
from tests.support.kernel_events import kernel_ms_per_step

ROOT = Path(__file__).resolve().parents[2]
# The real capture: Llama-2-7B shape, seq 4096, LoRA (DDP) and full (FSDP2) bf16 on 1 and 2 GPUs, made with
#   OUT=results PROFILES=tests/data/profiles/scaling_7b_2gpu bash benchmarks/h200x2_scaling.sh
SCALING_DATA = ROOT / "tests" / "data" / "profiles" / "scaling_7b_2gpu"
# Full fine-tuning on the defaults since backend.fsdp_all_gather=auto: the all-gathers on the copy engines.
COPY_ENGINE_DATA = ROOT / "tests" / "data" / "profiles" / "scaling_7b_2gpu_copy_engines"
MEASURED_MS = {1: 10.0, 2: 11.5}  # a planted run's measured step by GPUs (its profiled steps differ)


def test_the_script_keeps_small_exports_and_their_decomposition(tmp_path):
    sweep = tmp_path / "sweep"
    for job, (gpus, peft) in enumerate(((1, "lora"), (2, "lora"))):
        run_dir = sweep / str(job)
        run_dir.mkdir(parents=True)
        overrides = [f"peft={peft}", f"backend.gpus_per_node={gpus}", "precision=bf16"]
        RunResult(str(job), str(run_dir), overrides, "FINISHED").save()
        # The measured (untraced) steps: the profiler's overhead is each run's profiled step less this.
        (run_dir / SUMMARY).write_text(json.dumps({"metrics": {"step_time_ms": MEASURED_MS[gpus]}}))
        if gpus == 1:
            write_nsys(planted_rank(**ONE), run_dir / "profile.sqlite")
        else:
            for rank, plant in enumerate(RANKS):
                write_nsys(planted_rank(**plant), run_dir / f"profile_rank{rank}.sqlite")
    (sweep / "2").mkdir()  # a failed run: no exports, left out
    RunResult("2", str(sweep / "2"), ["peft=none", "backend.gpus_per_node=2", "precision=bf16"], "FAILED").save()
    out = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling_profiles.py"), str(sweep), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.gz")) == [
        "lora_1gpu/profile_rank0.sqlite.gz",
        "lora_2gpu/profile_rank0.sqlite.gz",
        "lora_2gpu/profile_rank1.sqlite.gz",
    ]
    kept = json.loads((out / "decomposition.json").read_text())
    assert kept == json.loads(json.dumps(folder_decompositions(out)))
    assert kept["lora"]["exposed_comm_ms"] == pytest.approx(0.3)  # the planted tail all-reduce
    assert "exposed communication" in done.stdout and f"{kept['lora']['difference_ms']:+.2f}" in done.stdout
    assert all(p.stat().st_size < 200_000 for p in out.rglob("*.gz"))
    lora = kept["lora"]
    profiled_over_measured = (lora["step_n_ms"] - MEASURED_MS[2]) - (lora["step_1_ms"] - MEASURED_MS[1])
    assert lora["profiler_overhead_ms"] == pytest.approx(profiled_over_measured) and profiled_over_measured != 0
    assert sum(lora[key] for key, _ in COMPONENTS) == pytest.approx(lora["difference_ms"], abs=1e-6)


@pytest.fixture(scope="module")
def real() -> dict[str, dict]:
    folders = sorted(f.name for f in SCALING_DATA.iterdir()) if SCALING_DATA.is_dir() else []
    assert any(CAPTURE_FOLDER.fullmatch(f) for f in folders), (
        f"{SCALING_DATA}: the two-GPU scaling capture is missing; on a machine with two GPUs run "
        "`OUT=results PROFILES=tests/data/profiles/scaling_7b_2gpu bash benchmarks/h200x2_scaling.sh` "
        "and commit the folder it fills"
    )
    return json.loads((SCALING_DATA / "decomposition.json").read_text())


def analysed_as_committed(data: Path) -> dict[str, dict]:
    """The decompositions of the captures in `data`, checked to sum to their differences and to be
    what its decomposition.json kept (the analysis reads the committed files as it did then)."""
    kept = json.loads((data / "decomposition.json").read_text())
    again = folder_decompositions(data)
    assert set(again) == set(kept)
    for combination, d in again.items():
        assert sum(d[key] for key, _ in COMPONENTS) == pytest.approx(d["difference_ms"], abs=1e-6)
        assert d["efficiency"] == pytest.approx(d["step_1_ms"] / d["step_n_ms"])
        for key, value in kept[combination].items():
            if isinstance(value, float):
                assert d[key] == pytest.approx(value, rel=1e-9, abs=1e-9), (combination, key)
    return again


def test_real_decomposition_sums_to_the_measured_difference(real):
    assert set(real) >= {"lora", "none"}  # peft=lora (DDP) and peft=none (full, FSDP2)
    analysed_as_committed(SCALING_DATA)


@pytest.mark.parametrize("combination", ["lora", "none"])
def test_real_kernel_times_are_traceable_to_the_events(real, combination):
    with tempfile.TemporaryDirectory() as tmp:
        for gpus, column in ((1, "ms_1"), (2, "ms_n")):
            folder = SCALING_DATA / f"{combination}_{gpus}gpu"
            a = folder_analysis(folder, Path(tmp))
            paths = sorted((Path(tmp) / folder.name).glob("*.sqlite"))
            assert len(paths) == gpus == max(1, len(a.ranks))
            single = [
                kernel_ms_per_step(p, analysis.window, len(analysis.window["steps"]), kernel_kinds.function_name)
                for p in paths
                for analysis in [full_analysis(p)]
            ]
            for k in real[combination]["kernels"]:
                if kernel_kinds.is_nccl(k["name"]) or k["name"].startswith(("Memcpy", "Memset")):
                    continue  # NCCL is not compute; copies and memsets are not in the kernel table
                # A family of Inductor's kernels is every numbered kernel of that name.
                truth = (
                    sum(ms for s in single for name, ms in s.items() if kernel_kinds.kernel_family(name) == k["name"])
                    / gpus
                )
                assert k[column] == pytest.approx(truth, rel=1e-6, abs=1e-6), (gpus, k["name"])


def test_real_straggler_agrees_with_the_rank_metrics(real):
    with tempfile.TemporaryDirectory() as tmp:
        for combination in real:
            a = folder_analysis(SCALING_DATA / f"{combination}_2gpu", Path(tmp))
            for f in a.findings:
                if f.id == "straggler":
                    most = max(a.ranks, key=lambda r: r["compute_ms_per_step"])
                    assert f.evidence["rank"] == most["rank"]
                    assert f.evidence["wait_ms_per_step"] <= real[combination]["imbalance_ms"] * 2 + 1e-6


def test_nccls_all_gather_kernels_beside_compute_point_to_the_copy_engines(real):
    """FSDP2's all-gathers ran as NCCL kernels on the SMs of the real capture, so the copy engines are the
    lever for its slower compute, unless the run already asked for them."""
    full = real["none"]
    assert any(f["family"] == "NCCL AllGather" and f["run_ms"] > 0 for f in full["by_family"])
    lever = scale_out_finding(full, "peft=none", {"peft": "none"}, None).evidence["levers"]["slower_compute_ms"]
    assert lever.startswith("backend.fsdp_all_gather=copy_engine")
    asked = scale_out_finding(full, "x", {"backend.fsdp_all_gather": "copy_engine"}, None)
    assert "NCCL_MAX_CTAS" in asked.evidence["levers"]["slower_compute_ms"]


def test_real_all_gathers_on_the_copy_engines_are_communication():
    """FSDP2's all-gathers as NCCL's copy-engine collective: peer-to-peer copies, each rank receiving the
    half of the bf16 weights it does not hold every step. They count as communication (not as work only
    the two-GPU run has), and the lever for the slower compute is no longer the copy engines."""
    d = analysed_as_committed(COPY_ENGINE_DATA)["none"]
    families = {f["family"]: f for f in d["by_family"]}
    assert "NCCL AllGather" not in families and "NCCL ReduceScatter bf16" in families
    peer_ms = families[kernel_kinds.PEER_COPIES_FAMILY]["run_ms"]
    assert families[kernel_kinds.PEER_COPIES_FAMILY]["baseline_ms"] == 0 and peer_ms > 10
    # Work only the two-GPU run has: FSDP2's copies and casts, less AdamW over half the weights; not the gathers.
    assert d["added_work_ms"] < families["copies"]["delta_ms"] < peer_ms
    with tempfile.TemporaryDirectory() as tmp:
        a = folder_analysis(COPY_ENGINE_DATA / "none_2gpu", Path(tmp))
        params = json.loads((COPY_ENGINE_DATA / "none_2gpu" / SUMMARY).read_text())["info"]["params_total"]
        for path in sorted((Path(tmp) / "none_2gpu").glob("*.sqlite")):
            window = full_analysis(path).window
            with sqlite3.connect(path) as con:
                (moved,) = con.execute(
                    "SELECT SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 10 AND start >= ? AND end <= ?",
                    (window["start_ns"], window["end_ns"]),
                ).fetchone()
            assert moved / len(window["steps"]) == params * 2 // 2  # bf16 bytes, from the one other rank
    # The run's NCCL metrics count the copies with NCCL's kernels, as the decomposition does.
    communication_ms = sum(
        f["run_ms"]
        for name, f in families.items()
        if name.startswith("NCCL") or name == kernel_kinds.PEER_COPIES_FAMILY
    )
    assert statistics.fmean(r["nccl_ms_per_step"] for r in a.ranks) == pytest.approx(communication_ms, rel=1e-3)
    lever = scale_out_finding(d, "peft=none", {"peft": "none"}, None).evidence["levers"]["slower_compute_ms"]
    assert "NCCL_MAX_CTAS" in lever
