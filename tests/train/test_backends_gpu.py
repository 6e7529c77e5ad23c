"""backend=nemo and backend=automodel train on a GPU through the real CLI and record what the torch
backend records, key by key: metrics.jsonl rows, summary.json, the MLflow run, and (with nsys on PATH)
the "step N" ranges the profile analysis reads in the capture window.

Needs CUDA, and NeMo (for the nemo tests) or NeMo AutoModel (for the automodel tests) in this
interpreter: `python -m pytest -m gpu tests/train/test_backends_gpu.py` on a GPU machine with both.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.automodel import require_automodel
from tests.nemo import require_nemo
from tests.support.cli import run_cli
from tests.support.mlflow_records import MlflowRecords, sqlite_uri

pytestmark = pytest.mark.gpu

PROFILE = "profile=nsys" if shutil.which("nsys") else "profile=none"
STEPS = [
    "device=cuda",
    "train.max_steps=8",
    "train.log_every=4",
    "train.warmup_steps=2",
    "capture.start_step=4",
    "capture.num_steps=2",
    "train.seq_length=1024",
    "train.micro_batch_size=1",
    PROFILE,
]
TWO_LAYERS = ["model=tiny_llama", "model.num_layers=2"]


def sweep(cwd: Path, *overrides: str) -> dict[tuple[str, str], Path]:
    """Run one sweep in `cwd`; its run directories by (backend, peft)."""
    cwd.mkdir(parents=True, exist_ok=True)
    # The test's own overrides last: they win over the shared STEPS (train.seq_length for a small checkpoint).
    proc = run_cli(["-m", *STEPS, *overrides], cwd)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    dirs = [summary.parent for summary in cwd.glob("multirun/*/*/*/summary.json")]
    return {(choice(d, "backend"), choice(d, "peft")): d for d in dirs}


def choice(run_dir: Path, group: str) -> str:
    return yaml.safe_load((run_dir / "config.yaml").read_text())[group]["name"]


def assert_recorded_like_torch(run_dir: Path, torch_dir: Path, cwd: Path) -> None:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(8))
    assert all(r["step_time_ms"] > 0 and r["loss"] > 0 and r["tokens"] == 1024 for r in rows)
    ours, theirs = (json.loads((d / "summary.json").read_text()) for d in (run_dir, torch_dir))
    for key in ("step_time_ms", "tokens_per_s", "tflops_per_gpu", "peak_mem_gb", "final_loss"):
        assert ours["metrics"][key] > 0, key
    assert set(ours["metrics"]) == set(theirs["metrics"])
    assert set(ours["timing"]) == set(theirs["timing"])
    assert ours["info"]["device_name"] == theirs["info"]["device_name"]
    records = MlflowRecords(sqlite_uri(cwd))
    children = records.runs("run")
    ours_run, torch_run = (
        next(r for r in children if all(r.data.params[k] == str(v) for k, v in choices.items()))
        for choices in (
            {"backend.name": choice(run_dir, "backend"), "peft.name": choice(run_dir, "peft")},
            {"backend.name": "torch", "peft.name": choice(torch_dir, "peft")},
        )
    )
    assert ours_run.info.status == torch_run.info.status == "FINISHED"
    assert set(ours_run.data.metrics) == set(torch_run.data.metrics)
    if PROFILE == "profile=nsys":
        analysis = json.loads((run_dir / "profile_analysis.json").read_text())
        assert set(analysis["window"]["steps"]) <= {4, 5} and analysis["window"]["steps"]
        assert analysis["top_kernels"]


def test_nemo_lora_and_full_record_what_torch_records(tmp_path):
    require_nemo()
    runs = sweep(tmp_path, "backend=torch,nemo", "peft=lora,none", *TWO_LAYERS)
    for peft in ("lora", "none"):
        assert_recorded_like_torch(runs[("nemo", peft)], runs[("torch", peft)], tmp_path)
    recipe = (runs[("nemo", "lora")] / "recipe.txt").read_text()
    assert "local_layer_spec" in recipe and "apply_rope_fusion=False" in recipe


def test_nemo_trains_a_two_layer_checkpoint_in_its_own_shape(tmp_path, hf_folder):  # noqa: F811
    require_nemo()
    runs = sweep(tmp_path, "backend=torch,nemo", f"model.path={hf_folder}", "train.seq_length=512")
    nemo_dir = runs[("nemo", "lora")]
    ours, theirs = (json.loads((runs[(b, "lora")] / "summary.json").read_text()) for b in ("nemo", "torch"))
    assert ours["info"]["random_init"] is False
    # The checkpoint's shape drives the FLOPs (2 layers, hidden 64), as it does for the torch backend.
    assert ours["info"]["flops_per_token"] == pytest.approx(theirs["info"]["flops_per_token"], rel=0.05)
    assert "num_layers=2" in (nemo_dir / "recipe.txt").read_text()


def test_automodel_lora_and_full_record_what_torch_records(tmp_path):
    require_automodel()
    runs = sweep(tmp_path, "backend=torch,automodel", "peft=lora,none", *TWO_LAYERS)
    for peft in ("lora", "none"):
        assert_recorded_like_torch(runs[("automodel", peft)], runs[("torch", peft)], tmp_path)
    assert (runs[("automodel", "lora")] / "automodel.yaml").exists()
