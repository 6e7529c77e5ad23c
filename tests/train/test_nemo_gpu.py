"""backend=nemo trains on a GPU and its record matches the torch backend's key for key.

Needs NeMo with Transformer Engine and CUDA: the NeMo container on a GPU node
(`python -m pytest -m "nemo and gpu"` there). Elsewhere it is skipped with that reason.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.nemo import nemo_llm  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.nemo, pytest.mark.gpu, pytest.mark.usefixtures("nemo_llm")]

STEPS = ["device=cuda", "train.max_steps=8", "train.log_every=4", "train.warmup_steps=2",
         "capture.start_step=3", "capture.num_steps=2", "profile=none"]


def run_dir_of(cwd: Path) -> Path:
    (summary,) = cwd.glob("outputs/*/*/summary.json")
    return summary.parent


def test_nemo_run_records_what_the_torch_backend_records(tmp_path):
    if importlib.util.find_spec("transformer_engine") is None:
        pytest.skip("Llama's fused rope in NeMo needs Transformer Engine: run this in the NeMo container")
    runs = {}
    for backend in ("nemo", "torch"):
        cwd = tmp_path / backend
        cwd.mkdir()
        proc = run_cli([f"backend={backend}", *STEPS], cwd)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[backend] = run_dir_of(cwd)

    nemo_dir = runs["nemo"]
    rows = [json.loads(line) for line in (nemo_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(8))
    assert all(r["step_time_ms"] > 0 and r["loss"] > 0 for r in rows)
    assert (nemo_dir / "recipe.json").exists()
    nemo, torch_ = (json.loads((runs[b] / "summary.json").read_text()) for b in ("nemo", "torch"))
    for key in ("step_time_ms", "tokens_per_s", "tflops_per_gpu", "peak_mem_gb", "final_loss"):
        assert nemo["metrics"][key] > 0, key
    assert set(nemo["metrics"]) == set(torch_["metrics"])
    assert set(nemo["timing"]) == set(torch_["timing"])
    assert nemo["info"]["device_name"] == torch_["info"]["device_name"]
