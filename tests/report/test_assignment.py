"""The profiling assignment's report over real profiles: Nsight Systems exports and a Nsight Compute
roofline pass captured on an H200 (tests/data/profiles), analysed by ghsweep.profile, logged to a
real MLflow store and reported by the real CLI."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ghsweep.core.names import CONTENDED_TAG, ROLE_SWEEP
from ghsweep.profile import roofline
from ghsweep.profile.analysis import analyze
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.report import __main__ as report_cli
from ghsweep.report.assignment import CHANGE_KINDS, profile_diff
from ghsweep.report.comparison_plots import short_name
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.report.sweeps import KERNELS, analysis, log_run

PROFILES = Path(__file__).resolve().parents[1] / "data" / "profiles"


def scenario(name: str, with_roofline: bool = False) -> ProfileAnalysis:
    a = analyze(PROFILES / name / "profile.sqlite")
    if with_roofline:
        a.roofline = roofline.kernel_points(PROFILES / name / "top_kernels_ncu.csv", [k["name"] for k in a.top_kernels])
    return a


def median_step_ms(name: str) -> float:
    steps = json.loads((PROFILES / name / "timing_unprofiled.json").read_text())["step_time_ms"]
    return statistics.median(steps[1:])  # the first step is warm-up


def test_diff_of_hand_made_profiles_normalises_per_iteration():
    def a(kernels, steps, all_names=None):
        top = [{"name": n, "total_ns": ns, "count": 1, "mean_ns": ns, "pct": 0.0} for n, ns in kernels.items()]
        return ProfileAnalysis(
            top_kernels=top,
            window={"steps": list(range(steps))},
            whole_trace={"kernels": [{"name": n} for n in all_names]} if all_names else {},
        )

    before = a({"gemm": 400, "norm": 100, "copy": 80, "cast": 50}, steps=4, all_names=["gemm", "norm", "copy", "cast"])
    after = a({"gemm": 200, "norm": 60, "fused": 30, "copy": 21}, steps=2, all_names=["gemm", "norm", "fused", "copy"])
    kinds = {c.name: (c.kind, c.baseline_ns, c.optimised_ns) for c in profile_diff(before, after)}
    # Per iteration: gemm 100 -> 100, norm 25 -> 30, copy 20 -> 10.5, cast removed, fused added.
    assert kinds == {
        "gemm": ("unchanged", 100, 100),
        "norm": ("slower", 25, 30),
        "copy": ("faster", 20, 10.5),
        "cast": ("removed", 12.5, None),
        "fused": ("added", None, 15),
    }
    # Without the other run's whole-trace kernel list a kernel outside its top list is not called removed.
    before.whole_trace = {}
    assert {c.name: c.kind for c in profile_diff(after, before)}["fused"] == "left top"
    assert {c.name: c.kind for c in profile_diff(before, after)}["cast"] == "removed"
    # A whole-trace list cut short (more distinct kernels than listed) cannot prove a kernel absent.
    after.whole_trace["distinct_kernels"] = 60
    assert {c.name: c.kind for c in profile_diff(before, after)}["cast"] == "left top"


def test_diff_of_real_profiles_unified_memory_vs_clean():
    diff = {c.name: c.kind for c in profile_diff(scenario("unified"), scenario("clean"))}
    # Unified memory's page-migration elementwise kernel is a top kernel there and falls out of the
    # clean run's top five; the GEMMs stay within 5% per iteration.
    elementwise = [n for n, k in diff.items() if "unrolled_elementwise_kernel" in n]
    assert elementwise and all(diff[n] in ("removed", "left top") for n in elementwise)
    assert sum(k == "unchanged" for n, k in diff.items() if n.startswith("nvjet_sm90")) >= 3
    assert set(diff.values()) <= set(CHANGE_KINDS)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("assignment")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    store = MlflowStore(uri, "assignment_test")
    runs = {}
    for label, name, with_roofline, workers in (
        ("baseline", "dataload", False, "0"),
        ("optimised", "clean", True, "4"),
    ):
        analysis = scenario(name, with_roofline)
        runs[label] = log_run(
            store,
            tmp,
            None,
            0,
            [f"dataloader.num_workers={workers}"],
            "FINISHED",
            {"step_time_ms": median_step_ms(name), "gpu_idle_pct": analysis.gpu_idle_pct},
            [3.0, 2.5],
            analysis=analysis,
        )
    return uri, tmp, runs


def test_assignment_command_writes_top5_roofline_speedup_and_diff(two_runs):
    uri, tmp, runs = two_runs
    out = tmp / "report"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ghsweep.report",
            "--assignment",
            runs["baseline"],
            runs["optimised"],
            "--tracking-uri",
            uri,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    speedup = median_step_ms("dataload") / median_step_ms("clean")
    assert f"speedup of one iteration: {speedup:.2f}x" in proc.stdout
    md = (out / "assignment.md").read_text()
    assert "| dataloader.num_workers | 0 | 4 |" in md
    baseline_part = md.split("## Top-5 kernels: baseline")[1].split("## Top-5 kernels: optimised")[0]
    optimised_part = md.split("## Top-5 kernels: optimised")[1].split("## ")[0]
    for part, name in ((baseline_part, "dataload"), (optimised_part, "clean")):
        rows = [line for line in part.splitlines() if line.startswith("| ") and line[2].isdigit()]
        assert len(rows) == 5
        top = scenario(name).top_kernels
        assert [r.split(" | ")[1] for r in rows] == [short_name(k["name"], 90) for k in top]
    assert "No roofline points: this run's profile had no Nsight Compute pass." in baseline_part
    # The clean run's GEMMs were profiled by ncu: compute-bound at hundreds of TFLOP/s on the H200.
    gemm_rows = [r for r in optimised_part.splitlines() if "nvjet_sm90" in r]
    assert gemm_rows and all(r.rstrip(" |").endswith("compute bound") for r in gemm_rows)
    assert all(200 < float(r.split(" | ")[7]) < 1000 for r in gemm_rows)
    assert (out / "plots" / "roofline.png").stat().st_size > 5000
    assert "## Kernel mix: profile diff" in md and "| unchanged | nvjet_sm90" in md
    page = (out / "assignment.html").read_text()
    assert page.count("data:image/png;base64,") == 1


def test_assignment_command_names_a_missing_run(two_runs):
    uri, tmp, runs = two_runs
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ghsweep.report",
            "--assignment",
            runs["baseline"],
            "no-such-run",
            "--tracking-uri",
            uri,
            "--out",
            str(tmp / "x"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("ghsweep.report: 'no-such-run': no run of that name or id with tag ghsweep.role=run in sqlite:///")
    )


def test_every_top_kernel_of_a_torch_trace_gets_its_roofline_point():
    """The PyTorch trace spells `at::native::(anonymous namespace)::`, Nsight Compute `at::<unnamed>::`:
    the assignment's Top-5 rows still carry each kernel's point (none shows "-")."""
    from ghsweep.profile.run_analysis import full_analysis
    from ghsweep.report.assignment import top_kernel_rows

    a = full_analysis(PROFILES / "clean" / "torch_trace.json", ncu_csv=PROFILES / "clean" / "top_kernels_ncu.csv")
    rows = top_kernel_rows(a)
    assert len(rows) == 5 and all(row[-1] != "-" and row[-3] != "-" for row in rows), rows
    adam = next(row for row in rows if "multi_tensor_apply_kernel" in row[1])
    assert adam[-1] == "memory bound"


def test_assignment_of_a_sweep_on_a_busy_machine_takes_the_most_tokens_per_s_and_says_why(tmp_path, capsys):
    """No speedup is compared with a baseline measured on a busy machine: the optimised run is the one
    with the most tokens/s, not the fastest step (the slowest run's step time is the lowest here, as a
    busy machine's can be), and stderr says the speedup is the load's as much as the code's."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = MlflowStore(uri, "busy")
    parent = store.start_run("sweep 2026-01-02/00-00-00", ROLE_SWEEP, {})
    for job, (precision, step_ms, tokens_per_s) in enumerate(
        (("fp32", 200.0, 1000.0), ("fp16", 90.0, 900.0), ("bf16", 150.0, 2000.0))
    ):
        run_id = log_run(
            store,
            tmp_path,
            parent,
            job,
            [f"precision={precision}"],
            "FINISHED",
            {"step_time_ms": step_ms, "tokens_per_s": tokens_per_s},
            [3.0, 2.5],
            analysis=analysis(KERNELS),
        )
        store.set_tags(run_id, {CONTENDED_TAG: "other processes used 1.4 of 2 CPU cores"} if job == 0 else {})
    store.finish(parent, "FINISHED")
    out = tmp_path / "report"
    argv = ["--assignment", "sweep 2026-01-02/00-00-00", "--tracking-uri", uri, "--out", str(out)]
    assert report_cli.main(argv) == 0
    said = capsys.readouterr()
    assert said.err == (
        "ghsweep.report: the runs were measured on a busy machine (MLflow tag ghsweep.contended): the "
        "assignment's speedup is the machine's load as much as the code's\n"
    )
    assert said.out.startswith("speedup of one iteration: 1.33x (precision fp32 -> bf16); ")
    assert "| precision | fp32 | bf16 |" in (out / "assignment.md").read_text()
