"""One run on several GPUs: per-rank nsys exports planted with the real export schema (planted.py),
with NCCL collectives beside and after the compute, and one rank slower than the others. The truth
(communication share, exposed communication, the straggler) is known by construction."""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ghsweep.profile.ranks import STRAGGLER_MIN_PCT
from ghsweep.profile.run_analysis import full_analysis, rank_analysis
from tests.profile.planted import GEMM, MS, OPTIMIZER, US, Run, write_nsys

ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
STEPS, GEMMS = 6, 40
# The last bucket's all-reduce after the backward: it runs alone (exposed) on every rank.
TAIL_US = 300
BUCKET_US = 150


def data_parallel_rank(gemm_us: int, slowest_gemm_us: int) -> tuple[Run, dict]:
    """One rank of DDP: GEMMs back to back, an all-reduce every 10 GEMMs beside them, and a final
    all-reduce that waits for the slowest rank (its compute at `slowest_gemm_us`) before its own
    TAIL_US. Returns the run and its truth over the steady steps (steps 1..)."""
    run = Run()
    t = 0
    truth = {"nccl_ns": 0, "kernel_ns": 0, "exposed_ns": 0, "span": [None, None], "compute_ns": 0}
    for i in range(STEPS):
        host0, gpu = t, t + 200 * US
        step_first = None
        for j in range(GEMMS):
            start = gpu + 1 * US
            gpu = run.launch(host0 + j * 20 * US, start, gemm_us * US, GEMM)
            step_first = step_first or start
            if j % 10 == 9 and j < GEMMS - 1:  # a bucket's all-reduce, overlapped by the next GEMMs
                run.launch(host0 + j * 20 * US, gpu + 2 * US, BUCKET_US * US, ALLREDUCE)
        # The tail all-reduce starts when this rank is done and ends TAIL_US after the slowest rank is.
        wait = GEMMS * (slowest_gemm_us - gemm_us) * US
        tail_start = gpu + 1 * US
        gpu = run.launch(host0 + GEMMS * 20 * US, tail_start, wait + TAIL_US * US, ALLREDUCE)
        gpu = run.launch(host0 + (GEMMS + 1) * 20 * US, gpu + 1 * US, 100 * US, OPTIMIZER)
        end = gpu + 20 * US
        run.ranges.append((f"step {i}", host0, end, 4242))
        if i >= 1:
            buckets = GEMMS // 10 - 1
            truth["nccl_ns"] += buckets * BUCKET_US * US + wait + TAIL_US * US
            truth["kernel_ns"] += GEMMS * gemm_us * US + buckets * BUCKET_US * US + wait + TAIL_US * US + 100 * US
            truth["exposed_ns"] += wait + TAIL_US * US
            truth["compute_ns"] += GEMMS * gemm_us * US + 39 * US + 100 * US  # the GEMMs' 1 us gaps are not compute
            truth["span"][0] = truth["span"][0] or step_first
            truth["span"][1] = gpu
        t = end + 1 * MS
    return run, truth


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, list[dict]]:
    """Rank 1's GEMMs take 260 us against rank 0's 200: rank 1 is the straggler, rank 0 waits."""
    folder = tmp_path_factory.mktemp("ranks")
    truths = []
    for rank, gemm_us in ((0, 200), (1, 260)):
        run, truth = data_parallel_rank(gemm_us, 260)
        write_nsys(run, folder / f"profile_rank{rank}.sqlite")
        truths.append(truth)
    return folder, truths


def test_single_rank_communication_matches_the_plant(two_ranks):
    folder, truths = two_ranks
    comm = full_analysis(folder / "profile_rank0.sqlite").communication
    truth = truths[0]
    # The first steady step is warm-up-free; steps 1..5 are the window (no warm-up planted).
    assert comm["nccl_time_pct"] == pytest.approx(100 * truth["nccl_ns"] / truth["kernel_ns"], rel=0.02)
    span = truth["span"][1] - truth["span"][0]
    assert comm["exposed_nccl_pct"] == pytest.approx(100 * truth["exposed_ns"] / span, rel=0.02)
    assert comm["compute_ms_per_step"] == pytest.approx(truth["compute_ns"] / (STEPS - 1) / 1e6, rel=0.02)


def test_run_on_one_gpu_has_no_communication_block():
    clean = full_analysis(Path(__file__).resolve().parents[1] / "data" / "profiles" / "clean" / "profile.sqlite")
    assert clean.communication == {} and clean.nccl_time_pct is None


def test_ranks_are_combined_and_the_straggler_named(two_ranks):
    folder, truths = two_ranks
    result = rank_analysis([folder / "profile_rank0.sqlite", folder / "profile_rank1.sqlite"], None, 2)
    rows = result.ranks
    assert [r["rank"] for r in rows] == [0, 1]
    # Rank 0 waits for rank 1 in the tail all-reduce: more exposed communication, less busy compute.
    assert rows[0]["exposed_nccl_pct"] > rows[1]["exposed_nccl_pct"] > 0
    assert rows[1]["compute_ms_per_step"] == pytest.approx(1.3 * rows[0]["compute_ms_per_step"], rel=0.02)
    # Rank 0 waits 40 x 60 us per step in the tail all-reduce: that is its extra NCCL time.
    assert rows[0]["nccl_ms_per_step"] - rows[1]["nccl_ms_per_step"] == pytest.approx(GEMMS * 60 / 1000, rel=0.01)
    assert result.nccl_time_pct == pytest.approx((rows[0]["nccl_time_pct"] + rows[1]["nccl_time_pct"]) / 2)
    straggler = next(f for f in result.findings if f.id == "straggler")
    assert straggler.evidence["rank"] == 1 and "rank 1 is a straggler" in straggler.message
    assert straggler.evidence["wait_ms_per_step"] == pytest.approx(GEMMS * 60 / 1000, rel=0.01)
    # The waiting shows as exposed communication (rank 0: 12 ms waited per 5 steps of ~10 ms windows).
    assert "exposed_communication" in [f.id for f in result.findings]


def test_balanced_ranks_name_no_straggler(tmp_path):
    paths = []
    for rank in (0, 1):
        run, _ = data_parallel_rank(200, 200)
        paths.append(write_nsys(run, tmp_path / f"profile_rank{rank}.sqlite"))
    result = rank_analysis(paths, None, 2)
    ids = [f.id for f in result.findings]
    assert "straggler" not in ids
    # Only the tail all-reduce (300 us of ~8.5 ms steps) is exposed: under the finding's threshold.
    assert "exposed_communication" not in ids and 0 < result.exposed_nccl_pct < 10


def test_a_missing_rank_is_a_health_finding(two_ranks):
    folder, _ = two_ranks
    result = rank_analysis([folder / "profile_rank0.sqlite"], None, 2)
    health = [f for f in result.findings if f.id == "profile_health"]
    assert health and health[0].evidence["missing_ranks"] == [1]


def test_cli_analyses_every_rank_of_a_run_directory(two_ranks):
    folder, _ = two_ranks
    out = subprocess.run(
        [sys.executable, "-m", "ghsweep.analyze", str(folder), "--json"], capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout)
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    text = subprocess.run(
        [sys.executable, "-m", "ghsweep.analyze", str(folder)], capture_output=True, text=True, check=True
    ).stdout
    assert "## Ranks" in text and "rank 1 is a straggler" in text


# Real per-rank exports of two H200s (benchmarks/h200x2_scaling.sh, steps 10-11 captured): Llama-2-7B
# shape, seq 4096, LoRA bf16 with DDP (all-reduce) and full bf16 with FSDP2 (all-gather, reduce-scatter).
REAL = Path(__file__).resolve().parents[1] / "data" / "profiles"


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory) -> dict[str, list[Path]]:
    out = {}
    for name in ("ddp2_lora_7b", "fsdp2_full_7b"):
        folder = tmp_path_factory.mktemp(name)
        for packed in sorted((REAL / name).glob("profile_rank*.sqlite.gz")):
            (folder / packed.name.removesuffix(".gz")).write_bytes(gzip.decompress(packed.read_bytes()))
        out[name] = sorted(folder.glob("profile_rank*.sqlite"))
    return out


def nccl_ms_in_window(path: Path, window: dict) -> dict[str, float]:
    """NCCL kernel time (ms) per collective inside the window, summed straight from the export."""
    con = sqlite3.connect(path)
    rows = con.execute(
        "SELECT s.value, SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
        "WHERE s.value LIKE '%nccl%' AND k.start >= ? AND k.end <= ? GROUP BY s.value",
        (window["start_ns"], window["end_ns"]),
    ).fetchall()
    con.close()
    return {name: ns / 1e6 for name, ns in rows}


@pytest.mark.parametrize(
    "name,collectives", [("ddp2_lora_7b", {"AllReduce"}), ("fsdp2_full_7b", {"AllGather", "ReduceScatter"})]
)
def test_real_two_gpu_captures_show_each_rank_and_its_communication(real_runs, name, collectives):
    paths = real_runs[name]
    result = rank_analysis(paths, None, 2)
    assert [r["rank"] for r in result.ranks] == [0, 1]
    for path, row in zip(paths, result.ranks):
        single = full_analysis(path)
        # Step 10 is where the capture started (cudaProfilerStart): warm-up, whatever its length.
        assert single.window["steps"] == [11] and single.window["warmup_steps"] == [10]
        by_kernel = nccl_ms_in_window(path, single.window)
        # The collectives data parallelism needs, and nothing counted twice: the SQL sum over the window.
        assert {c for c in collectives if any(c in k for k in by_kernel)} == collectives
        assert row["nccl_ms_per_step"] == pytest.approx(sum(by_kernel.values()), rel=1e-6)
        comm = single.communication
        # Time with only NCCL running is part of NCCL time; most of it overlaps compute here.
        assert row["gpu_busy_pct"] > 90 and 0 < comm["exposed_nccl_ns"] < comm["nccl_ns"] / 2
    assert result.nccl_time_pct == pytest.approx(sum(r["nccl_time_pct"] for r in result.ranks) / 2)


@pytest.mark.parametrize("name", ["ddp2_lora_7b", "fsdp2_full_7b"])
def test_real_nccl_time_beside_compute_names_no_straggler(real_runs, name):
    """The ranks' NCCL time per step differs by 12-71 ms (the rank that launches its collective
    first runs the NCCL kernel beside its own compute), yet little of it shows on the critical
    path: the ranks' compute per step is within a few ms, so nobody is a straggler."""
    result = rank_analysis(real_runs[name], None, 2)
    rows = result.ranks
    assert abs(rows[0]["nccl_ms_per_step"] - rows[1]["nccl_ms_per_step"]) > 10
    slow, fast = sorted(rows, key=lambda r: -r["compute_ms_per_step"])
    shown = min(
        slow["compute_ms_per_step"] - fast["compute_ms_per_step"],
        fast["exposed_wait_ms_per_step"] - slow["exposed_wait_ms_per_step"],
    )
    assert 100 * max(shown, 0) / slow["window_ms_per_step"] < STRAGGLER_MIN_PCT
    assert "straggler" not in [f.id for f in result.findings]
    assert "profile_health" not in [f.id for f in result.findings]  # a sound real trace
