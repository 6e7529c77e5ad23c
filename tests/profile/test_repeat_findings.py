"""Findings that repeat: the same configuration profiled twice gets the same findings unless its
numbers differ beyond their intervals (each figure +- its band, findings.STARVED_BAND_PCT, ...). Held
to it on planted runs either side of a threshold, on a real pair (one scenario captured twice on
one H200), and on a real profile read against its measured steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ghsweep.profile.findings import (
    OVERHEAD_BAND_PCT,
    OVERHEAD_FINDING_PCT,
    STARVED_BAND_PCT,
    STARVED_BUSY_PCT,
    profiler_overhead,
)
from ghsweep.profile.overhead import MeasuredRun
from ghsweep.profile.result import Finding, ProfileAnalysis
from ghsweep.profile.run_analysis import full_analysis
from ghsweep.report.compare import top_finding
from ghsweep.report.sweep_source import SweepRun
from tests.profile.planted import MS, US, Run, write_nsys

DATA = Path(__file__).resolve().parents[1] / "data" / "profiles"
KERNEL_NS = 50 * US


def spaced(gap_ns: int) -> Run:
    """Steps of 100 kernels of 50 us, each gap_ns after the previous (busy = 50 / (50 + gap))."""
    run = Run()
    gpu = 1 * MS
    for i in range(4):
        host0 = gpu
        for _ in range(100):
            gpu += gap_ns
            gpu = run.launch(gpu - 1 * US, gpu, KERNEL_NS, "triton_poi_fused_mul_0")
        run.ranges.append((f"step {i}", host0, gpu, 4242))
    return run


def gap_for(busy_pct: float) -> int:
    return round(KERNEL_NS * (100 / busy_pct - 1))


def findings_of(run: Run, path: Path) -> list[Finding]:
    return full_analysis(write_nsys(run, path)).findings


@pytest.mark.parametrize("band_share", [0.3, 0.9])
def test_runs_either_side_of_a_threshold_within_their_intervals_get_the_same_findings(tmp_path, band_share):
    """GPU busy just under and just over the 85% threshold (within the band either side): the same
    finding, as info, said to be not established, and never a run's top finding."""
    below = findings_of(spaced(gap_for(STARVED_BUSY_PCT - band_share * STARVED_BAND_PCT)), tmp_path / "below.sqlite")
    above = findings_of(spaced(gap_for(STARVED_BUSY_PCT + band_share * STARVED_BAND_PCT)), tmp_path / "above.sqlite")
    assert [(f.id, f.severity) for f in below] == [(f.id, f.severity) for f in above] == [("gpu_starved", "info")]
    for f in below + above:
        assert "not established" in f.message and f.evidence["established"] is False
    run = SweepRun("id", "r", 0, "FINISHED", [], {}, {}, {}, analysis=ProfileAnalysis(findings=below))
    assert top_finding(run) is None


def test_runs_whose_intervals_lie_apart_get_different_findings(tmp_path):
    starved = findings_of(spaced(gap_for(STARVED_BUSY_PCT - STARVED_BAND_PCT - 1)), tmp_path / "starved.sqlite")
    busy = findings_of(spaced(gap_for(STARVED_BUSY_PCT + STARVED_BAND_PCT + 1)), tmp_path / "busy.sqlite")
    assert [(f.id, f.severity, f.evidence["established"]) for f in starved] == [("gpu_starved", "warning", True)]
    assert "not established" not in starved[0].message
    assert busy == []


@pytest.mark.parametrize(
    "profiled_ms, measured_ms, severity",
    [(104.5, 100.0, "info"), (105.5, 100.0, "info"), (107.0, 100.0, "warning"), (103.0, 100.0, None)],
)
def test_the_profilers_overhead_near_its_threshold_is_the_same_finding_either_side(profiled_ms, measured_ms, severity):
    """OVERHEAD_FINDING_PCT (5%) +- OVERHEAD_BAND_PCT: 4.5% and 5.5% are one finding, not established;
    7% is a warning; 3% none."""
    a = ProfileAnalysis(profiled_step_ms=profiled_ms, measured_step_ms=measured_ms)
    a.profiler_overhead_pct = 100 * (profiled_ms - measured_ms) / measured_ms
    found = [(f.id, f.severity) for f in profiler_overhead(a)]
    assert found == ([("profiler_overhead", severity)] if severity else [])
    assert OVERHEAD_FINDING_PCT - OVERHEAD_BAND_PCT < 4.5 and 7.0 >= OVERHEAD_FINDING_PCT + OVERHEAD_BAND_PCT


def test_real_repeats_of_one_configuration_get_the_same_findings():
    """The offload scenario of tests/data/profiles captured twice on one H200 (offload/ and
    crosscheck/, steps 1-8 and 2-4): its host-sync share is 4.5% in one and 4.0% in the other, under
    the 5% threshold in both, and both say so the same way."""
    a = full_analysis(DATA / "offload" / "profile.sqlite")
    b = full_analysis(DATA / "crosscheck" / "profile.sqlite")
    assert a.profiled_step_ms == pytest.approx(b.profiled_step_ms, rel=0.02)  # repeats: the same step
    assert [(f.id, f.severity) for f in a.findings] == [(f.id, f.severity) for f in b.findings]
    assert [f.id for f in a.findings] == ["host_sync", "offload_cost"]


def test_a_real_profile_against_its_measured_steps():
    """The data-loading scenario of tests/data/profiles, profiled with the default trace set: its
    traced steps ran 28% slower than its untraced ones (nsys_overhead.json). The profiler's finding
    comes first, and the idle findings are stated net of it."""
    measured = json.loads((DATA / "nsys_overhead.json").read_text())["dataload"]["unprofiled_ms"]
    a = full_analysis(DATA / "dataload" / "profile.sqlite", measured=MeasuredRun(step_ms=measured))
    assert a.measured_step_ms == measured and a.profiled_step_ms is not None
    assert a.profiler_overhead_pct == pytest.approx(100 * (a.profiled_step_ms - measured) / measured)
    assert a.findings[0].id == "profiler_overhead" and a.profiler_overhead_pct > 20
    starved = next(f for f in a.findings if f.id == "gpu_starved")
    assert "net of the profiler's" in starved.message
    assert starved.evidence["gpu_busy_pct"] > starved.evidence["traced_gpu_busy_pct"]
