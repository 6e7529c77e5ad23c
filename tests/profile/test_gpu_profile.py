"""profile=nsys_ncu through the real worker path on a GPU: the worker runs under nsys with
ghsweep's command line, the report is exported and analysed, a second short run under ncu gives
the roofline of the top kernels, and profile=torch on the GPU records kernels.

Run on a GPU machine with nsys and ncu on PATH: `pytest -m gpu tests/profile/test_gpu_profile.py`.
"""

from __future__ import annotations

import json
import shutil

import pytest
from omegaconf import OmegaConf

from ghsweep.core.gpu import probe_gpu
from ghsweep.core.run_dir import NSYS_REPORT, NSYS_SQLITE, PROFILE_ANALYSIS
from ghsweep.launch.run_planner import node_plan
from ghsweep.launch.worker_process import run_worker
from ghsweep.profile.pipeline import after_worker
from ghsweep.profile.result import METRICS
from tests.support.compose import compose_config

pytestmark = pytest.mark.gpu


def profiled_run(tmp_path, *overrides: str) -> tuple[dict, object]:
    cfg = compose_config(
        "device=cuda",
        "train.max_steps=10",
        "train.log_every=10",
        "train.compile=false",
        "train.seq_length=256",
        "train.micro_batch_size=4",
        "capture.start_step=4",
        "capture.num_steps=4",
        *overrides,
    )
    run_dir = tmp_path / cfg.profile.name
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    # The job's own plan on this node, saved where the worker reads it.
    plan, config = node_plan(cfg, run_dir, cfg.profile.name, [], probe_gpu(), None)
    plan.save(run_dir)
    exit = run_worker(plan.worker_command, run_dir, 900)
    assert exit.returncode == 0, (run_dir / "worker.log").read_text()[-3000:]
    outcome = after_worker(config, plan, lambda command, work: run_worker(command, work, 900).returncode)
    assert "ghsweep.profile_error" not in outcome.tags, outcome.tags
    return json.loads((run_dir / PROFILE_ANALYSIS).read_text()), outcome


@pytest.mark.skipif(not (shutil.which("nsys") and shutil.which("ncu")), reason="needs nsys and ncu on PATH")
def test_nsys_ncu_run_is_analysed(tmp_path):
    analysis, outcome = profiled_run(tmp_path, "profile=nsys_ncu")
    run_dir = tmp_path / "nsys_ncu"
    assert (run_dir / NSYS_REPORT).exists() and (run_dir / NSYS_SQLITE).exists()
    assert analysis["source"]["kind"] == "nsys"
    window = analysis["window"]
    # Step 4, where the capture began, is warm-up (steps.Steps.capture_start); the rest are steady.
    assert window["warmup_steps"][:1] == [4] and set(window["steps"]) <= {5, 6, 7} and len(window["steps"]) >= 2
    assert analysis["top_kernels"] and 0 < analysis["gpu_busy_pct"] <= 100
    assert analysis["phases_ms_per_step"]["forward"] > 0
    # One GPU runs no NCCL kernel, so the two communication metrics stay unset (not a misleading 0).
    single_gpu = set(METRICS) - {"nccl_time_pct", "exposed_nccl_pct"}
    assert set(outcome.metrics) == {*single_gpu, "ncu_s"} and outcome.metrics["ncu_s"] > 0
    roof = analysis["roofline"]
    top = {k["short_name"] for k in analysis["top_kernels"]}
    assert roof["kernels"] and roof["missing"] == [], roof["missing"]  # a point for every top kernel
    assert top <= set(roof["ncu_pass"]["kernels"]) and "per launch configuration" in roof["ncu_pass"]["launches"]
    assert all(p["bound"] in ("compute_bound", "memory_bound", "latency_bound") for p in roof["kernels"])
    assert any(p["bytes_dram"] > 0 for p in roof["kernels"])  # the extra metrics were collected
    names = {p.name for p in outcome.artifacts}
    assert {
        "profile_report.md",
        "top_kernels.md",
        "gap_histogram.png",
        "roofline.png",
        "profile.sqlite",
        "top_kernels_ncu.csv",
    } <= names
    print(json.dumps({k: analysis[k] for k in METRICS}, indent=1))
    print(json.dumps(roof["kernels"], indent=1)[:3000])


def test_torch_profiler_on_gpu_records_kernels(tmp_path):
    analysis, outcome = profiled_run(tmp_path, "profile=torch")
    assert analysis["source"] == {**analysis["source"], "kind": "torch", "device": "cuda"}
    assert analysis["top_kernels"] and analysis["gpu_busy_pct"] > 0
    assert outcome.tags["ghsweep.profile_used"] == "torch"
