"""The comparison's "Because" line and its kernels table on real profiles (tests/data/profiles: Nsight
Systems exports of the same tiny-model training in bf16 and in fp8 on an H200): each run against
the baseline, where the step time went (profile/delta.py, the code `python -m ghsweep.analyze RUN
--against BASELINE` runs), told by kernel family whatever the kernels' generated names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ghsweep.profile import delta
from ghsweep.profile.kernel_kinds import step_family
from ghsweep.profile.run_analysis import full_analysis
from ghsweep.report import compare
from ghsweep.report.sweep_source import SweepRun
from tests.support.kernel_events import kernel_ms_per_step

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
        analysis=full_analysis(PROFILES / precision / "profile.sqlite"),
    )


def test_fp8_against_bf16_says_which_gemms_went_and_what_replaced_them(tmp_path):
    bf16, fp8 = profiled(0, "bf16", 1000.0), profiled(1, "fp8", 1310.0)
    c = compare.build("precision", [bf16, fp8], baseline=0)
    assert compare.step_delta(c, 0) is None  # the baseline against itself
    d = compare.step_delta(c, 1)
    assert d is not None
    assert sum(d["parts"].values()) == pytest.approx(d["difference_ms"], abs=1e-9)
    families = {f["family"]: f for f in d["by_family"]}
    assert families["bf16 GEMMs"]["delta_ms"] < -1 and families["fp8 GEMMs"]["baseline_ms"] == 0
    assert families["fp8 GEMMs"]["run_ms"] > 1
    # Every family's time is the events' own, clipped to each run's window.
    for run, column in ((bf16, "baseline_ms"), (fp8, "run_ms")):
        assert run.analysis is not None
        truth = kernel_ms_per_step(
            PROFILES / run.knobs["precision"] / "profile.sqlite",
            run.analysis.window,
            len(run.analysis.window["steps"]),
            step_family,
        )
        copies = sum(v for k, v in run.analysis.time_per_step["compute_by_name_ms"].items() if k.startswith("Mem"))
        for family, row in families.items():
            expected = truth.get(family, 0.0) + (copies if family == "copies" else 0.0)
            assert row[column] == pytest.approx(expected, rel=1e-6, abs=1e-9), (family, column)

    because = next(line for line in compare.verdict(c) if line.startswith("Because, per step: "))
    assert because == f"Because, per step: {delta.because(d)}."
    assert "bf16 GEMMs -" in because and "fp8 GEMMs +" in because

    compare.write_report(c, tmp_path)
    report = (tmp_path / "comparison.md").read_text()
    assert "## Kernels: #1 fp8 against the baseline" in report
    assert "| bf16 GEMMs |" in report and "| fp8 GEMMs |" in report and f"{d['difference_ms']:+.2f}" in report


def test_analyze_against_prints_the_same_delta(tmp_path):
    """`python -m ghsweep.analyze RUN --against BASELINE --json` holds step_delta, the code the comparison uses."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ghsweep.analyze",
            str(PROFILES / "fp8" / "profile.sqlite"),
            "--against",
            str(PROFILES / "bf16" / "profile.sqlite"),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    printed = json.loads(done.stdout)["step_delta"]
    expected = delta.step_delta(
        full_analysis(PROFILES / "bf16" / "profile.sqlite"), full_analysis(PROFILES / "fp8" / "profile.sqlite")
    )
    assert printed == json.loads(json.dumps(expected))
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "ghsweep.analyze",
            str(PROFILES / "fp8" / "profile.sqlite"),
            "--against",
            "nowhere.sqlite",
        ],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "nowhere.sqlite" in missing.stderr and "Traceback" not in missing.stderr


def test_no_step_delta_without_profiles():
    plain = [
        SweepRun(f"r{j}", f"r{j}", j, "FINISHED", [f"precision=p{j}"], {}, {"tokens_per_s": t}, {})
        for j, t in ((0, 1.0), (1, 2.0))
    ]
    c = compare.build("q", plain, baseline=0)
    assert compare.step_delta(c, 1) is None
    assert not [line for line in compare.verdict(c) if line.startswith("Because")]
