"""The analysis on runs captured on an H200 by `python tests/profile/capture_scenarios.py gpu-runs`
(unpacked into tests/data/profiles): ghsweep's own bf16 and fp8 training, and one run under nsys
and the PyTorch profiler at once. fp8 is recognised by what the kernels are (both directions), the
numbers agree with `nsys stats`, and the two readers agree on the same run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ghsweep.profile.run_analysis import full_analysis

DATA = Path(__file__).resolve().parents[1] / "data" / "profiles"
CAPTURE = "python tests/profile/capture_scenarios.py gpu-runs --out DIR on a GPU machine with nsys"


def needs(*paths: str) -> list[Path]:
    missing = [p for p in paths if not (DATA / p).exists()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not in tests/data/profiles yet: captured by `{CAPTURE}`")
    return [DATA / p for p in paths]


def stats(run: str, report: str) -> list[dict]:
    with open(DATA / run / f"profile_stats_{report}.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("run", ["bf16", "fp8", "crosscheck"])
def test_kernel_totals_match_nsys_stats(run):
    (sqlite,) = needs(f"{run}/profile.sqlite")
    whole = full_analysis(sqlite).whole_trace
    rows = stats(run, "cuda_gpu_kern_sum")
    assert whole["kernel_count"] == sum(int(r["Instances"]) for r in rows)
    assert whole["kernel_total_ns"] == pytest.approx(sum(int(r["Total Time (ns)"]) for r in rows), rel=0.01)
    mine = {k["name"]: k for k in whole["kernels"]}
    for row in rows[:5]:
        assert mine[row["Name"]]["total_ns"] == pytest.approx(int(row["Total Time (ns)"]), rel=0.01)


def test_fp8_run_is_recognised_by_its_kernels():
    (sqlite,) = needs("fp8/profile.sqlite")
    a = full_analysis(sqlite, {"precision": "fp8"})
    assert a.window["basis"] == "nvtx steps" and a.window["steps"]
    assert a.kernels["fp8_gemm_ns"] >= 0.5 * a.kernels["gemm_ns"] > 0
    assert "fp8_not_effective" not in [f.id for f in a.findings]


def test_bf16_gemms_under_precision_fp8_fire_the_rule():
    """A run whose GEMMs really are bf16, read as an fp8 run (what a recipe that was not applied gives)."""
    (sqlite,) = needs("bf16/profile.sqlite")
    a = full_analysis(sqlite, {"precision": "fp8"})
    assert a.kernels["fp8_gemm_ns"] == 0 and a.kernels["gemm_ns"] > 0
    assert "fp8_not_effective" in [f.id for f in a.findings]
    assert "fp8_not_effective" not in [f.id for f in full_analysis(sqlite, {"precision": "bf16"}).findings]


def test_torch_trace_and_nsys_agree_on_one_run():
    sqlite, trace, info = needs(
        "crosscheck/profile.sqlite", "crosscheck/torch_trace.json.gz", "crosscheck/capture.json"
    )
    # One run seen by both profilers agrees closely; two runs of the same program within run-to-run noise.
    close = 0.5 if json.loads(info.read_text())["simultaneous"] else 3.0
    nsys, torch = full_analysis(sqlite), full_analysis(trace)
    # nsys leaves out the step its capture started in (warm-up); the torch trace has no such start.
    assert nsys.window["steps"] == [s for s in torch.window["steps"] if s not in nsys.window["warmup_steps"]]
    assert torch.gpu_busy_pct == pytest.approx(nsys.gpu_busy_pct, abs=close)
    # Demangled names differ between CUPTI and nsys for templated lambdas; short names match.
    assert {k["short_name"] for k in torch.top_kernels[:3]} == {k["short_name"] for k in nsys.top_kernels[:3]}
    for key in ("kernel_time_pct", "memcpy_time_pct", "exposed_memcpy_pct"):
        assert getattr(torch, key) == pytest.approx(getattr(nsys, key), abs=close), key
    assert torch.whole_trace["kernel_count"] == pytest.approx(nsys.whole_trace["kernel_count"], rel=0.02)
    for kind in ("HtoD", "DtoH"):
        assert torch.whole_trace["memory_ops"][kind]["bytes"] == pytest.approx(
            nsys.whole_trace["memory_ops"][kind]["bytes"], rel=0.01
        )
