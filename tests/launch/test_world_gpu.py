"""One combination on two GPUs of this machine, for real: NCCL under torchrun through the CLI, LoRA
with DDP and full fine-tuning with FSDP2, each rank under nsys and the analysis reading every rank.

Run on a machine with two GPUs and nsys with `pytest -m gpu tests/launch/test_world_gpu.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.support.cli import run_cli
from tests.support.mlflow_records import MlflowRecords, assert_two_runs_per_gpu_one_at_a_time, sqlite_uri

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two NVIDIA GPUs (one combination on two)"),
    pytest.mark.skipif(shutil.which("nsys") is None, reason="needs Nsight Systems (nsys) on PATH"),
]


def test_two_gpus_train_with_nccl_and_every_rank_is_profiled(tmp_path):
    proc = run_cli(
        [
            "-m",
            "experiment=smoke",
            "device=cuda",
            "peft=lora,none",
            "backend.gpus_per_node=2",
            "train.max_steps=10",
            "profile=nsys",
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for run_dir in sorted((tmp_path / "sweep").glob("[0-9]")):
        result = json.loads((run_dir / "result.json").read_text())
        assert result["status"] == "FINISHED" and result["metrics"]["world_size"] == 2
        assert sorted(p.name for p in run_dir.glob("profile_rank*.sqlite")) == [
            "profile_rank0.sqlite",
            "profile_rank1.sqlite",
        ]
        analysis = json.loads((run_dir / "profile_analysis.json").read_text())
        assert [r["rank"] for r in analysis["ranks"]] == [0, 1]
        assert all(r["nccl_time_pct"] > 0 for r in analysis["ranks"])
        assert result["metrics"]["nccl_time_pct"] == pytest.approx(analysis["nccl_time_pct"])
        assert "## Ranks" in Path(run_dir / "profile_report.md").read_text()


def test_a_local_sweep_runs_one_combination_per_gpu_at_once(tmp_path):
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=submitit_local",
            "experiment=smoke",
            "device=cuda",
            "precision=bf16",
            "peft=lora,none",
            "repeat=1,2",
            "train.max_steps=6",
            "profile=none",
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
        # Listed: unlisted, a GPU this test process (or another test's) holds a CUDA context on is left out.
        env={"CUDA_VISIBLE_DEVICES": "0,1"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    runs = MlflowRecords(sqlite_uri(tmp_path)).runs("run")
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert_two_runs_per_gpu_one_at_a_time(runs, "ghsweep.device_uuid")
