"""Where the step time went between two runs (profile/delta.py), on planted pairs whose every term is
known by construction: two runs differing only in Inductor's generated suffixes, a bf16/fp8 pair, a
run whose profiler cost more than its baseline's, and a 2-rank FSDP-like run against a 1-rank one
(the scale-out finding with its levers, in the sweep comparison and its terminal summary)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ghsweep.profile.delta import PARTS, because, step_delta
from ghsweep.profile.overhead import MeasuredRun
from ghsweep.profile.run_analysis import full_analysis, rank_analysis
from ghsweep.profile.scaling import decompose, scale_out_finding
from tests.profile.planted import GEMMS, ONE, RANKS, planted_rank, training_run, write_nsys

PROFILES = Path(__file__).resolve().parents[1] / "data" / "profiles"
FP8_GEMM = "nvjet_sm90_qqtst_256x128_128x4_1x2_h_bz_coopA_TNT"
REDUCE_SCATTER = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
STEP_GEMMS = 40  # planted.training_run's GEMMs a step


def named(i: int) -> str:
    return f"step {i}"


def test_runs_differing_only_in_inductor_suffixes_differ_in_nothing(tmp_path):
    a = full_analysis(write_nsys(training_run(named, loss="triton_poi_fused_add_mul_3"), tmp_path / "a.sqlite"))
    b = full_analysis(write_nsys(training_run(named, loss="triton_poi_fused_add_mul_7"), tmp_path / "b.sqlite"))
    d = step_delta(a, b)
    assert d["difference_ms"] == pytest.approx(0, abs=1e-9)
    assert all(v == pytest.approx(0, abs=1e-9) for v in d["parts"].values())
    # One kernel under both names: its family, its time in both runs (20 us a step).
    row = next(k for k in d["kernels"] if k["name"] == "triton_poi_fused_add_mul")
    assert row["baseline_ms"] == row["run_ms"] == pytest.approx(0.02)
    assert row["family"] == "fused elementwise / casts"


def test_fp8_against_bf16_by_construction(tmp_path):
    """The same steps with 40 bf16 GEMMs of 200 us or 40 fp8 GEMMs of 120 us, back to back: the
    difference is the GEMMs' and nothing else's."""
    bf16 = full_analysis(write_nsys(training_run(named), tmp_path / "bf16.sqlite"))
    fp8 = full_analysis(write_nsys(training_run(named, gemm=FP8_GEMM, gemm_us=120), tmp_path / "fp8.sqlite"))
    d = step_delta(bf16, fp8)
    assert d["difference_ms"] == pytest.approx(STEP_GEMMS * (120 - 200) / 1e3, abs=1e-6)
    assert d["parts"]["added_work_ms"] == pytest.approx(d["difference_ms"], abs=1e-6)
    assert sum(abs(v) for k, v in d["parts"].items() if k != "added_work_ms") == pytest.approx(0, abs=1e-6)
    families = {f["family"]: f for f in d["by_family"]}
    assert families["bf16 GEMMs"]["delta_ms"] == pytest.approx(-STEP_GEMMS * 0.2, abs=1e-6)
    assert families["fp8 GEMMs"]["delta_ms"] == pytest.approx(STEP_GEMMS * 0.12, abs=1e-6)
    assert [f["family"] for f in d["by_family"][:2]] == ["bf16 GEMMs", "fp8 GEMMs"]


def test_the_profilers_share_of_a_difference_is_its_own_part(tmp_path):
    """Two identical runs, the second's profiler 0.5 ms a step dearer: the profiled steps are the
    same, the measured ones differ by that much, and the parts say which is which."""
    path = write_nsys(training_run(named), tmp_path / "run.sqlite")
    profiled = full_analysis(path).profiled_step_ms
    assert profiled is not None
    base = full_analysis(path, measured=MeasuredRun(step_ms=profiled - 0.2))
    run = full_analysis(path, measured=MeasuredRun(step_ms=profiled - 0.7))
    d = step_delta(base, run)
    assert d["parts"]["profiler_overhead_ms"] == pytest.approx(0.5)
    assert d["parts"]["idle_ms"] == pytest.approx(-0.5)
    assert d["measured_difference_ms"] == pytest.approx(-0.5)
    assert sum(d["parts"].values()) == pytest.approx(d["difference_ms"], abs=1e-9)


@pytest.fixture(scope="module")
def fsdp_like(tmp_path_factory):
    """1 rank against 2 ranks whose collective is an fp32 reduce-scatter (FSDP's gradients)."""
    folder = tmp_path_factory.mktemp("fsdp")
    one = full_analysis(write_nsys(planted_rank(**ONE), folder / "profile.sqlite"))
    paths = [
        write_nsys(planted_rank(**r, collective=REDUCE_SCATTER), folder / f"profile_rank{i}.sqlite")
        for i, r in enumerate(RANKS)
    ]
    return one, rank_analysis(paths, None, 2)


def test_two_ranks_against_one_by_construction(fsdp_like):
    one, many = fsdp_like
    d = step_delta(one, many)
    assert sum(d["parts"].values()) == pytest.approx(d["difference_ms"], abs=1e-9)
    assert d["parts"]["exposed_comm_ms"] == pytest.approx(0.3, abs=1e-6)  # the planted tail collective
    assert d["parts"]["slower_compute_ms"] == pytest.approx(GEMMS * ((210 + 230) / 2 - 200) / 1e3, abs=1e-6)
    families = {f["family"]: f for f in d["by_family"]}
    assert families["NCCL ReduceScatter f32"]["baseline_ms"] == 0 < families["NCCL ReduceScatter f32"]["run_ms"]
    # The same split the Scaling section shows.
    assert {k: decompose(one, many)[k] for k, _ in PARTS} == d["parts"]


def test_scale_out_finding_names_the_parts_and_the_trainers_knobs(fsdp_like):
    one, many = fsdp_like
    d = decompose(one, many)
    f = scale_out_finding(d, "peft=none", {"peft": "none"}, one_gpu_peak_gb=54.0)
    assert f.id == "scale_out" and f.severity == "warning"
    assert f"{100 * d['efficiency']:.0f}% of one GPU's throughput" in f.message
    assert "precision.reduce_dtype=param" in f.evidence["levers"]["exposed_comm_ms"]
    assert "backend.data_parallel=ddp" in f.evidence["levers"]["added_work_ms"]
    assert "54 GB" in f.evidence["levers"]["added_work_ms"]
    # Its only collective is a reduce-scatter: no all-gather kernels for the copy engines to take off the SMs.
    assert "fsdp_all_gather" not in f.evidence["levers"]["slower_compute_ms"]
    assert "NCCL_MAX_CTAS" in f.evidence["levers"]["slower_compute_ms"]
    largest = max((k for k, _ in PARTS), key=lambda k: d[k])
    assert f"{d[largest]:+.1f} ms" in f.message
    # A knob already set is no lever.
    done = scale_out_finding(d, "x", {"precision.reduce_dtype": "param", "backend.data_parallel": "ddp"}, None)
    assert "reduce_dtype" not in str(done.evidence["levers"]) and "data_parallel" not in str(done.evidence["levers"])


def sweep_runs(one, many, tags: dict[str, str] | None = None) -> list:
    """The 1-GPU and 2-GPU runs of one combination as the sweep's comparison reads them; `tags`: the 2-GPU run's."""
    from ghsweep.report.sweep_source import SweepRun

    return [
        SweepRun(
            f"id{g}",
            f"run{g}",
            g - 1,
            "FINISHED",
            ["peft=none", f"backend.gpus_per_node={g}"],
            {},
            {"tokens_per_s": 1000.0 / g, "peak_mem_gb": 54.0},
            (tags or {}) if g == 2 else {},
            analysis=a,
        )
        for g, a in ((1, one), (2, many))
    ]


def test_the_sweep_gives_the_multi_gpu_run_its_scale_out_finding(fsdp_like):
    from ghsweep.report.compare import build, table, verdict

    one, many = fsdp_like
    runs = sweep_runs(one, many)
    c = build("sweep", runs)
    assert [f.id for f in many.findings][0] == "scale_out"
    line = next(line for line in verdict(c) if line.startswith("Scale-out #1"))
    assert "precision.reduce_dtype=param" in line
    assert table(c)[1][1][-1].startswith("on 2 GPUs each GPU gives")  # the run's top finding
    build("sweep", runs)  # built again (python -m ghsweep.report): still one scale-out finding
    assert [f.id for f in many.findings].count("scale_out") == 1


def test_a_run_whose_auto_took_the_copy_engines_is_not_told_to_take_them(tmp_path):
    """NCCL's all-gather kernels in the 2-GPU profile point to the copy engines, unless the run's tag says
    its all-gather already was theirs (auto resolved, with no override on the command line)."""
    from ghsweep.report.compare import FSDP_ALL_GATHER_TAG, build

    one = full_analysis(write_nsys(planted_rank(**ONE), tmp_path / "profile.sqlite"))
    many = rank_analysis(
        [
            write_nsys(planted_rank(**r, collective=ALL_GATHER), tmp_path / f"profile_rank{i}.sqlite")
            for i, r in enumerate(RANKS)
        ],
        None,
        2,
    )

    def slower_compute_lever(tags: dict[str, str]) -> str:
        build("sweep", sweep_runs(one, many, tags))
        found = next(f for f in many.findings if f.id == "scale_out")
        return found.evidence["levers"]["slower_compute_ms"]

    assert slower_compute_lever({}).startswith("backend.fsdp_all_gather=copy_engine")
    assert slower_compute_lever({FSDP_ALL_GATHER_TAG: "nccl"}).startswith("backend.fsdp_all_gather=copy_engine")
    assert "NCCL_MAX_CTAS" in slower_compute_lever({FSDP_ALL_GATHER_TAG: "copy_engine"})


def test_because_says_a_small_models_changes_in_microseconds_and_leaves_out_none():
    d = {
        "by_family": [
            {"family": "bf16 GEMMs", "delta_ms": -141.23},
            {"family": "fused elementwise / casts", "delta_ms": 0.412},
            {"family": "attention", "delta_ms": -0.0002},
        ]
    }
    assert because(d) == "bf16 GEMMs -141.2 ms, fused elementwise / casts +412 µs"
    assert because({"by_family": [{"family": "attention", "delta_ms": 0.0}]}) == ""


def test_because_names_a_change_of_overlap_that_hides_a_familys_time():
    """The families of a 7B sweep's fp8 without offload against bf16 with it (an H200): the offload
    copies had run behind the forward, so the families alone (-133.3 ms) overstated the step's change
    (-60 ms). The overlap change here is set by hand to what they would have hidden."""
    families = [
        {"family": "bf16 GEMMs", "delta_ms": -143.9},
        {"family": "fp8 GEMMs", "delta_ms": 88.5},
        {"family": "copies", "delta_ms": -77.9},
    ]
    offload = {"by_family": families, "parts": {"overlap_change_ms": 75.0}}
    assert because(offload) == (
        "bf16 GEMMs -143.9 ms, fp8 GEMMs +88.5 ms, copies -77.9 ms, less overlap across streams +75.0 ms"
    )
    more = {"by_family": families[:1], "parts": {"overlap_change_ms": -20.0}}
    assert because(more) == "bf16 GEMMs -143.9 ms, more overlap across streams -20.0 ms"
    # Under a tenth of the largest change, or under a millisecond: the families say it.
    assert because({"by_family": families, "parts": {"overlap_change_ms": 14.0}}).endswith("copies -77.9 ms")
    small = [{"family": "attention", "delta_ms": -0.4}]
    assert because({"by_family": small, "parts": {"overlap_change_ms": 0.6}}) == "attention -400 µs"


def test_because_leaves_overlap_out_where_it_did_not_change():
    """Real profiles: activation offload whose copies held the step (exposed, not overlapped) against
    plain bf16. The copies are step time here, and the line names no overlap."""
    offload = full_analysis(PROFILES / "offload" / "profile.sqlite")
    bf16 = full_analysis(PROFILES / "bf16" / "profile.sqlite")
    d = step_delta(bf16, offload)
    assert abs(d["parts"]["overlap_change_ms"]) < 1.0
    assert because(d).startswith("copies +")
    assert "overlap" not in because(d)
