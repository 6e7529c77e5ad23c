"""ModelShape: one mapping from a Hugging Face config, one from a model config (conf/model)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from transformers import LlamaConfig

from ghsweep.train.flops import ModelShape

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_a_transformers_config_and_the_model_config_it_was_made_from_agree():
    model = OmegaConf.load(CONF / "model" / "llama2_7b.yaml")
    hf = LlamaConfig(
        hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_key_value_heads,
        vocab_size=model.vocab_size,
    )
    assert ModelShape.from_hf(hf.to_dict()) == ModelShape.of_model(model) == ModelShape(4096, 11008, 32, 32, 32, 32000)


def test_a_config_json_without_key_value_heads_has_one_per_attention_head():
    hf = {
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 256,
    }
    assert ModelShape.from_hf(hf).num_key_value_heads == 4
    assert ModelShape.from_hf({**hf, "num_key_value_heads": 2}).num_key_value_heads == 2
