"""The comparison's kernel diff on real profiles (tests/data/profiles: Nsight Systems exports of the
same tiny-model training in bf16 and in fp8 on an H200): each run against the baseline, the kernels
whose time per step changed most, and the verdict's "because" sentence."""

from __future__ import annotations

from pathlib import Path

from ghsweep.profile.analysis import analyze
from ghsweep.report import compare
from ghsweep.report.assignment import profile_diff
from ghsweep.report.sweep_source import SweepRun

PROFILES = Path(__file__).resolve().parents[1] / "data" / "profiles"


def profiled(job: int, precision: str, tokens_per_s: float) -> SweepRun:
    metrics = {"tokens_per_s": tokens_per_s, "tokens_per_s_ci_low": tokens_per_s * 0.99}
    metrics["tokens_per_s_ci_high"] = tokens_per_s * 1.01
    return SweepRun(
        f"r{job}",
        f"r{job}",
        job,
        "FINISHED",
        [f"precision={precision}"],
        {},
        metrics,
        {},
        analysis=analyze(PROFILES / precision / "profile.sqlite"),
    )


def test_each_run_gets_the_kernels_that_changed_most_against_the_baseline(tmp_path):
    bf16, fp8 = profiled(0, "bf16", 1000.0), profiled(1, "fp8", 1310.0)
    c = compare.build("precision", [bf16, fp8], baseline=0)
    diff = compare.kernel_diff(c, 1)
    assert compare.kernel_diff(c, 0) == []  # the baseline against itself
    # What the assignment report computes, without the unchanged, the largest changes first.
    changed = [k for k in profile_diff(bf16.analysis, fp8.analysis) if k.kind != "unchanged"]
    assert {k.name for k in diff} <= {k.name for k in changed} and diff
    moves = [abs((k.optimised_ns or 0) - (k.baseline_ns or 0)) for k in diff]
    assert moves == sorted(moves, reverse=True)
    assert moves[0] == max(abs((k.optimised_ns or 0) - (k.baseline_ns or 0)) for k in changed)
    # fp8 trains through other GEMM kernels than bf16: some appear, some go.
    assert {k.kind for k in diff} & {"added", "entered top"} and {k.kind for k in diff} & {"removed", "left top"}

    lines = compare.verdict(c)
    because = next(line for line in lines if line.startswith("Because, per step: "))
    assert compare.change_text(diff[0]) in because

    compare.write_report(c, tmp_path)
    report = (tmp_path / "comparison.md").read_text()
    assert "## Kernels: " in report and compare.change_text(diff[0]).split(" ")[0] in report


def test_no_kernel_diff_without_profiles():
    plain = [
        SweepRun(f"r{j}", f"r{j}", j, "FINISHED", [f"precision=p{j}"], {}, {"tokens_per_s": t}, {})
        for j, t in ((0, 1.0), (1, 2.0))
    ]
    c = compare.build("q", plain, baseline=0)
    assert compare.kernel_diff(c, 1) == []
    assert not [line for line in compare.verdict(c) if line.startswith("Because")]
