"""ModelShape: one mapping from a Hugging Face config and back, one from a model config (conf/model)."""

from __future__ import annotations

from transformers import LlamaConfig

from ghsweep.train.flops import ModelShape
from tests.support.compose import compose_typed


def test_the_model_config_and_the_transformers_config_of_llama2_7b_agree():
    # transformers' LlamaConfig defaults are Llama-2-7B's published config.
    model = compose_typed("model=llama2_7b").model
    assert (
        ModelShape.from_hf(LlamaConfig().to_dict())
        == ModelShape.of_model(model)
        == ModelShape(4096, 11008, 32, 32, 32, 32000)
    )


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


def test_the_shape_written_as_a_transformers_config_reads_back_as_itself():
    shape = ModelShape(
        hidden_size=64,
        intermediate_size=176,
        num_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    built = LlamaConfig(**shape.hf_fields())
    assert ModelShape.from_hf(built.to_dict()) == shape
    assert (built.num_hidden_layers, built.num_key_value_heads) == (2, 2)
