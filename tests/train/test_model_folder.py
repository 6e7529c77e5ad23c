"""model.path: a local Hugging Face folder (safetensors + tokenizer) is loaded, not randomly built."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ghsweep.train import data as dolly
from ghsweep.train.model import build_model
from tests.conftest import MlflowRecords, run_cli, sqlite_uri


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A small Llama saved with save_pretrained, with a BPE tokenizer trained on dolly records."""
    folder = tmp_path_factory.mktemp("tiny_hf_llama")
    texts = [dolly.prompt_text(r) + r["response"] for r in dolly.synthetic_dolly(300, seed=5)]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    # Trained norms are not the initial 1.0: a conversion that skips them shows.
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            torch.nn.init.uniform_(param, 0.5, 1.5)
    model.save_pretrained(folder)
    assert (folder / "model.safetensors").exists()
    return folder


def test_build_model_loads_the_saved_weights(hf_folder):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"path": str(hf_folder)})
    model, tokenizer, random_init = build_model(cfg, torch.device("cpu"), torch.float32)
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
