"""model.path: a local Hugging Face folder (safetensors + tokenizer) is loaded, not randomly built."""

from __future__ import annotations

import json

import torch
from transformers import LlamaForCausalLM

from ghsweep.train.model import build_model
from ghsweep.train.tokenizer import load_tokenizer
from tests.support.cli import run_cli
from tests.support.compose import compose_typed
from tests.support.mlflow_records import MlflowRecords, sqlite_uri


def test_build_model_loads_the_saved_weights(hf_folder):
    config = compose_typed()
    config.model.path = str(hf_folder)
    tokenizer = load_tokenizer(config)
    model, random_init = build_model(config.model, tokenizer, torch.device("cpu"), torch.float32)
    saved = LlamaForCausalLM.from_pretrained(hf_folder)
    assert not random_init
    assert torch.equal(model.model.embed_tokens.weight, saved.model.embed_tokens.weight)
    assert tokenizer.bos_token_id == 1 and tokenizer.eos_token_id == 2


def test_cli_trains_from_the_folder(hf_folder, tmp_path):
    proc = run_cli(
        ["experiment=smoke", f"model.path={hf_folder}", "precision=fp32", "train.max_steps=4", "offload=off"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(next(tmp_path.glob("outputs/*/*/summary.json")).read_text())
    assert summary["info"]["random_init"] is False
    (run,) = MlflowRecords(sqlite_uri(tmp_path)).runs("run")
    assert run.data.tags["ghsweep.random_init"] == "False"
    assert run.data.params["model.path"] == str(hf_folder)
