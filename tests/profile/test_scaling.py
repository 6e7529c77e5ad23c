"""Where the per-GPU throughput goes from 1 to N GPUs (profile/scaling.py), on planted per-rank
nsys exports whose every term is known by construction: the same GEMMs slower on 2 GPUs, a cast
kernel only there, one rank computing more (the other waits in the all-reduce), a tail all-reduce
nobody hides, more idle time between steps, and bucket all-reduces beside the GEMMs (overlapped:
no time lost)."""

from __future__ import annotations

import pytest

from ghsweep.profile import kernel_kinds
from ghsweep.profile.engine import PEER_COPY_KIND
from ghsweep.profile.run_analysis import full_analysis, rank_analysis
from ghsweep.profile.scaling import COMPONENTS, decompose, pairs, table
from tests.profile.planted import GEMMS, ONE, RANKS, STEPS, Run, planted_rank, write_nsys


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scaling")
    one = full_analysis(write_nsys(planted_rank(**ONE), folder / "profile.sqlite"))
    paths = [write_nsys(planted_rank(**r), folder / f"profile_rank{i}.sqlite") for i, r in enumerate(RANKS)]
    return one, rank_analysis(paths, None, 2)


def test_decomposition_matches_the_plant_and_sums_to_the_difference(scaled):
    one, many = scaled
    d = decompose(one, many)
    idle_share = (STEPS - 1) / STEPS  # the idle time between steps, per steady step of the window
    assert d["slower_compute_ms"] == pytest.approx(GEMMS * ((210 + 230) / 2 - 200) / 1e3, abs=1e-6)
    assert d["added_work_ms"] == pytest.approx(40 / 1e3, abs=1e-6)
    assert d["overlap_change_ms"] == pytest.approx(0, abs=1e-6)  # one compute stream in both runs
    # Rank 0 waits 20 x 20 us per step for rank 1; the mean over the two ranks is half.
    assert d["imbalance_ms"] == pytest.approx(GEMMS * 20 / 1e3 / 2, abs=1e-6)
    # Only the tail all-reduce is exposed: the bucket all-reduces beside the GEMMs cost nothing.
    assert d["exposed_comm_ms"] == pytest.approx(300 / 1e3, abs=1e-6)
    assert d["idle_ms"] == pytest.approx((150 - 50) * idle_share / 1e3, abs=1e-6)
    assert sum(d[key] for key, _ in COMPONENTS) == pytest.approx(d["difference_ms"], abs=1e-9)
    assert d["step_n_ms"] - d["step_1_ms"] == pytest.approx(d["difference_ms"])
    # The step times the analyses measured, not another definition.
    assert d["step_1_ms"] == pytest.approx(one.window["duration_ns"] / STEPS / 1e6)
    top = {k["name"]: k for k in d["kernels"]}
    assert top["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"]["delta_ms"] == pytest.approx(d["slower_compute_ms"])
    assert top["fsdp_cast_kernel"]["ms_1"] == 0 and top["fsdp_cast_kernel"]["ms_n"] == pytest.approx(0.04)


def on_the_copy_engines(run: Run) -> Run:
    """`run` with each NCCL kernel replaced by a peer-to-peer copy at the same times: NCCL's copy-engine
    collectives (FSDP2's all-gather under backend.fsdp_all_gather=copy_engine) launch no kernel."""
    collectives = [k for k in run.kernels if kernel_kinds.is_nccl(k[2])]
    run.kernels = [k for k in run.kernels if not kernel_kinds.is_nccl(k[2])]
    run.copies += [(s, e, 64 << 20, PEER_COPY_KIND, 2, 2, c) for s, e, _, c in collectives]
    return run


def test_collectives_on_the_copy_engines_are_communication_as_nccls_kernels_are(scaled, tmp_path):
    """The same run with its collectives as copies instead of kernels splits the same way: its tail
    collective is exposed communication, not added work, and the ones beside the GEMMs cost nothing."""
    one, on_the_sms = scaled
    paths = [
        write_nsys(on_the_copy_engines(planted_rank(**r)), tmp_path / f"profile_rank{i}.sqlite")
        for i, r in enumerate(RANKS)
    ]
    copied = rank_analysis(paths, None, 2)
    d, as_kernels = decompose(one, copied), decompose(one, on_the_sms)
    assert {key: d[key] for key, _ in COMPONENTS} == pytest.approx({key: as_kernels[key] for key, _ in COMPONENTS})
    assert d["exposed_comm_ms"] == pytest.approx(300 / 1e3, abs=1e-6) and d["added_work_ms"] == pytest.approx(0.04)
    families = {f["family"]: f["run_ms"] for f in d["by_family"]}
    collectives_ms = next(f["run_ms"] for f in as_kernels["by_family"] if f["family"] == "NCCL AllReduce bf16")
    assert families[kernel_kinds.PEER_COPIES_FAMILY] == pytest.approx(collectives_ms) and "copies" not in families
    for rank, kernels_rank in zip(copied.ranks, on_the_sms.ranks):
        for metric in ("exposed_nccl_pct", "nccl_time_pct"):
            assert rank[metric] == pytest.approx(kernels_rank[metric]) and rank[metric] > 0


def test_the_imbalance_is_the_straggler_and_the_findings_agree(scaled):
    _, many = scaled
    straggler = next(f for f in many.findings if f.id == "straggler")
    assert straggler.evidence["rank"] == 1  # the rank with the most compute per step
    assert straggler.evidence["wait_ms_per_step"] == pytest.approx(GEMMS * 20 / 1e3, abs=1e-6)


def test_balanced_ranks_with_overlapped_nccl_name_no_straggler(tmp_path):
    """Both ranks compute alike; rank 0's NCCL kernels run far longer (launched early, beside its
    compute), which is no time lost: no straggler, and no imbalance in the decomposition."""
    even = {**RANKS[0], "gemm_us": 220, "slowest_gemm_us": 220}
    early = {**even, "buckets": True}
    late = {**even, "buckets": False}
    paths = [write_nsys(planted_rank(**r), tmp_path / f"profile_rank{i}.sqlite") for i, r in enumerate((early, late))]
    many = rank_analysis(paths, None, 2)
    rows = many.ranks
    # 4 bucket all-reduces of 110 us a step on rank 0 only
    assert rows[0]["nccl_ms_per_step"] - rows[1]["nccl_ms_per_step"] == pytest.approx(0.44, abs=1e-6)
    assert "straggler" not in [f.id for f in many.findings]
    one = full_analysis(write_nsys(planted_rank(**ONE), tmp_path / "profile.sqlite"))
    assert decompose(one, many)["imbalance_ms"] == pytest.approx(0, abs=1e-9)


def test_pairs_match_runs_by_combination_and_the_table_adds_up(scaled):
    one, many = scaled
    world = ("backend.gpus_per_node=",)
    found = pairs(
        [
            (["peft=lora", "backend.gpus_per_node=1"], one),
            (["peft=lora", "backend.gpus_per_node=2"], many),
            (["peft=none", "backend.gpus_per_node=2"], many),  # no 1-GPU twin: not decomposed
        ],
        world,
    )
    assert [name for name, _ in found] == ["peft=lora"]
    header, rows = table(found[0][1])
    assert header[1] == "ms per step" and len(rows) == len(COMPONENTS) + 1
    assert sum(float(r[1]) for r in rows[:-1]) == pytest.approx(float(rows[-1][1]), abs=0.01 * len(rows))


def test_the_sweep_comparison_shows_the_decomposition(scaled, tmp_path):
    """The comparison report (report/compare.py) gets one section per combination run on 1 and 2 GPUs."""
    from ghsweep.report.compare import build, write_report
    from ghsweep.report.sweep_source import SweepRun

    one, many = scaled
    runs = [
        SweepRun(
            f"id{g}", f"run{g}", g, "FINISHED", ["peft=lora", f"backend.gpus_per_node={g}"], {}, {}, {}, analysis=a
        )
        for g, a in ((1, one), (2, many))
    ]
    report = next(p for p in write_report(build("sweep", runs), tmp_path) if p.suffix == ".md").read_text()
    d = decompose(one, many)
    assert "## Scaling: peft=lora" in report
    assert f"{d['exposed_comm_ms']:+.2f}" in report and f"{d['difference_ms']:+.2f}" in report
    assert "fsdp_cast_kernel" in report
