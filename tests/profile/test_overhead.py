"""The profiler's own overhead (profile/overhead.py): a planted run whose traced steps are slower
than its measured (untraced) ones by a known amount of launch gaps, every number checked against
the raw events; the findings stated net of it; a run directory through the CLI; and the sweep's
follow-up work found running beside a run's steps."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ghsweep.core.run_dir import CONFIG, METRICS, RUN_PLAN, SUMMARY
from ghsweep.profile.overhead import MeasuredRun
from ghsweep.profile.run_analysis import full_analysis
from tests.profile.planted import MS, US, Run, write_nsys

STEPS, KERNELS, KERNEL_US, GAP_US = 6, 100, 8, 12


def launch_gapped() -> Run:
    """Steps of KERNELS short kernels, each launched GAP_US late (the GPU waits for the host): the
    launch gaps a tracer's per-launch cost makes."""
    run = Run()
    gpu = 1 * MS
    for i in range(STEPS):
        host0 = gpu
        for _ in range(KERNELS):
            gpu += GAP_US * US
            gpu = run.launch(gpu - 2 * US, gpu, KERNEL_US * US, "triton_poi_fused_mul_0")
        run.ranges.append((f"step {i}", host0, gpu, 4242))
    return run


def profiled_step_from_events(path: Path) -> float:
    """The mean profiled step (ms) from the export: its steps' GPU work, first kernel to last."""
    con = sqlite3.connect(path)
    first, last = con.execute("SELECT MIN(start), MAX(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    con.close()
    return (last - first) / STEPS / 1e6


@pytest.fixture(scope="module")
def gapped(tmp_path_factory) -> Path:
    return write_nsys(launch_gapped(), tmp_path_factory.mktemp("gapped") / "profile.sqlite")


def test_without_a_measured_step_the_gaps_are_the_runs_own(gapped):
    a = full_analysis(gapped)
    assert a.profiled_step_ms == pytest.approx(profiled_step_from_events(gapped), rel=1e-9)
    assert a.measured_step_ms is None and a.profiler_overhead_pct is None
    assert {"gpu_starved", "launch_bound"} <= {f.id for f in a.findings}


def test_an_overhead_that_explains_the_gaps_leaves_no_idle_finding(gapped):
    profiled = profiled_step_from_events(gapped)
    kernel_ms = KERNELS * KERNEL_US / 1e3
    a = full_analysis(gapped, measured=MeasuredRun(step_ms=kernel_ms))
    assert a.profiler_overhead_pct == pytest.approx(100 * (profiled - kernel_ms) / kernel_ms, rel=1e-9)
    first = a.findings[0]
    assert first.id == "profiler_overhead" and first.evidence["overhead_ms_per_step"] == pytest.approx(
        profiled - kernel_ms
    )
    assert f"{profiled - kernel_ms:.1f} ms per step" in first.message
    assert not {"gpu_starved", "launch_bound"} & {f.id for f in a.findings}


def test_idle_findings_are_stated_net_of_the_overhead(gapped):
    """Half the gaps are the tracer's: the rest is the run's own, and the findings say that much."""
    profiled = profiled_step_from_events(gapped)
    tracer_ms = KERNELS * GAP_US / 2 / 1e3
    a = full_analysis(gapped, measured=MeasuredRun(step_ms=profiled - tracer_ms))
    ids = [f.id for f in a.findings]
    assert ids[0] == "profiler_overhead" and "gpu_starved" in ids and "launch_bound" in ids
    starved = next(f for f in a.findings if f.id == "gpu_starved")
    net_step = profiled - tracer_ms
    kernel_ms = KERNELS * KERNEL_US / 1e3
    assert starved.evidence["gpu_busy_pct"] == pytest.approx(100 * kernel_ms / net_step, rel=1e-6)
    assert starved.evidence["idle_ms_per_step"] == pytest.approx(net_step - kernel_ms, rel=1e-6)
    assert starved.evidence["traced_gpu_busy_pct"] == pytest.approx(100 * kernel_ms / profiled, rel=1e-6)
    assert "net of the profiler's" in starved.message


def test_analyze_a_run_directory_reads_its_measured_steps(gapped, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "profile.sqlite").write_bytes(gapped.read_bytes())
    measured = profiled_step_from_events(gapped) / 1.25
    (run_dir / SUMMARY).write_text(json.dumps({"metrics": {"step_time_ms": measured}, "timing": {}, "info": {}}))
    out = subprocess.run(
        [sys.executable, "-m", "ghsweep.analyze", str(run_dir), "--json"], capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout)
    assert result["measured_step_ms"] == measured and result["profiler_overhead_pct"] == pytest.approx(25.0)
    assert result["findings"][0]["id"] == "profiler_overhead"
    text = subprocess.run(
        [sys.executable, "-m", "ghsweep.analyze", str(run_dir)], capture_output=True, text=True, check=True
    ).stdout
    assert "profiler overhead +25.0%" in text and "`profiler_overhead`" in text


def run_dir_with_steps(tmp_path: Path, go_made_at: float | None, capture_start: str = "auto") -> Path:
    """A run directory as a local sweep's worker leaves it: its plan names the measure_after file,
    2 warm-up steps, then 4 steps of 100 ms ending at the last flush, t=1000 s."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    go = run_dir / "measure_after"
    (run_dir / RUN_PLAN).write_text(json.dumps({"measure_after": str(go)}))
    (run_dir / CONFIG).write_text(f"train:\n  warmup_steps: 2\ncapture:\n  start_step: {capture_start}\n")
    (run_dir / METRICS).write_text("".join(json.dumps({"step": s, "step_time_ms": 100.0}) + "\n" for s in range(6)))
    (run_dir / SUMMARY).write_text(
        json.dumps({"metrics": {"step_time_ms": 100.0}, "timing": {"steady_from": 999.5, "steady_to": 1000.0}})
    )
    if go_made_at is not None:
        go.touch()
        os.utime(go, (go_made_at, go_made_at))
    return run_dir


@pytest.mark.parametrize(
    "made_at,overlapped",
    [(999.5, False), (999.6 - 0.2, False), (999.7, True), (None, True)],  # steps began by 999.6 s
)
def test_the_sweeps_work_beside_the_steps_is_found(tmp_path, gapped, made_at, overlapped):
    measured = MeasuredRun.of(run_dir_with_steps(tmp_path, made_at))
    assert (measured.overlap is not None) == overlapped
    ids = [f.id for f in full_analysis(gapped, measured=measured).findings]
    assert ("sweep_overlap" in ids) == overlapped


def test_profiled_steps_before_the_wait_count_too(tmp_path):
    """A capture window from step 1 runs before the wait at step 2: the steps from 1 on began by 999.5 s."""
    assert MeasuredRun.of(run_dir_with_steps(tmp_path / "a", 999.55)).overlap is None
    assert MeasuredRun.of(run_dir_with_steps(tmp_path / "b", 999.55, capture_start="1")).overlap is not None
