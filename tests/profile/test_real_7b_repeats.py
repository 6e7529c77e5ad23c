"""The 7B LoRA line profiled twice in one sweep on an H200 (tests/data/profiles/h200_7b_repeats):
repeats get the same findings, a repeat the profiler slowed says so first, and the step delta of fp8
against bf16 names the GEMMs that went and came, with the profiler's share kept apart."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ghsweep.profile.delta import step_delta
from ghsweep.profile.overhead import MeasuredRun
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.profile.run_analysis import full_analysis

DATA = Path(__file__).resolve().parents[1] / "data" / "profiles" / "h200_7b_repeats"
MEASURED = json.loads((DATA / "measured.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, ProfileAnalysis]:
    folder = tmp_path_factory.mktemp("h200_7b_repeats")
    out = {}
    for name, measured in MEASURED.items():
        sqlite = folder / f"{name}.sqlite"
        sqlite.write_bytes(gzip.decompress((DATA / name / "profile_rank0.sqlite.gz").read_bytes()))
        out[name] = full_analysis(sqlite, measured=MeasuredRun(step_ms=measured["measured_step_ms"]))
    return out


def test_the_repeats_of_bf16_get_the_same_findings(runs):
    first, second = runs["bf16_1"], runs["bf16_2"]
    # Two steady traced steps each (the capture's first is warm-up): their means are 2.2% apart, the
    # runs' untraced steps 0.4%.
    assert first.profiled_step_ms == pytest.approx(second.profiled_step_ms, rel=0.025)
    assert [(f.id, f.severity) for f in first.findings] == [(f.id, f.severity) for f in second.findings]


def test_the_repeat_the_profiler_slowed_says_so_first_and_the_rest_as_its_twin(runs):
    slowed, clean = runs["fp8_2"], runs["fp8_1"]
    for analysis, name in ((slowed, "fp8_2"), (clean, "fp8_1")):
        # The sweep's analysis at capture counted the capture's first step as steady too: within 1.5 points.
        assert analysis.profiler_overhead_pct == pytest.approx(
            MEASURED[name]["profiler_overhead_pct_at_capture"], abs=1.5
        )
    assert slowed.profiler_overhead_pct > 20 and slowed.findings[0].id == "profiler_overhead"
    assert abs(clean.profiler_overhead_pct) < 5 and "profiler_overhead" not in [f.id for f in clean.findings]
    # Net of the profiler, the slowed repeat's idle time is its twin's: no idle finding of its own.
    assert [f.id for f in slowed.findings[1:]] == [f.id for f in clean.findings]


def test_fp8_against_bf16_names_the_gemms_and_keeps_the_profilers_share_apart(runs):
    clean = step_delta(runs["bf16_1"], runs["fp8_1"])
    slowed = step_delta(runs["bf16_1"], runs["fp8_2"])
    for d in (clean, slowed):
        assert sum(d["parts"].values()) == pytest.approx(d["difference_ms"], abs=1e-6)
        families = {f["family"]: f["delta_ms"] for f in d["by_family"]}
        assert families["bf16 GEMMs"] < -100 and families["fp8 GEMMs"] > 50
    # The traced differences are 34 ms apart; the profiler's part holds that, and what is left (the
    # measured difference) agrees between the repeats within a millisecond.
    assert slowed["difference_ms"] - clean["difference_ms"] > 30
    assert slowed["parts"]["profiler_overhead_ms"] - clean["parts"]["profiler_overhead_ms"] > 30
    assert slowed["measured_difference_ms"] == pytest.approx(clean["measured_difference_ms"], abs=1.0)
