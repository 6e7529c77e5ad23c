"""backend=nemo without Transformer Engine (ghsweep.train.nemo.compat), checked on CPU: NeMo's LoRA
wraps Megatron's local layers of a 2-layer Llama-shaped GPTModel, and a Hugging Face checkpoint is
imported onto those layers in the checkpoint's own shape."""

from __future__ import annotations

import socket

import pytest
import torch

pytestmark = [pytest.mark.nemo, pytest.mark.usefixtures("nemo_llm")]

HIDDEN, FFN, RANK = 64, 128, 4
# Megatron's fused layers: (in, out) features, fc1 being gate and up together.
LAYER_SHAPES = {
    "linear_qkv": (HIDDEN, 3 * HIDDEN),
    "linear_proj": (HIDDEN, HIDDEN),
    "linear_fc1": (HIDDEN, 2 * FFN),
    "linear_fc2": (FFN, HIDDEN),
}


@pytest.fixture
def model_parallel(monkeypatch):
    """Megatron's parallel state for one CPU process (gloo), torn down after the test."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.mark.usefixtures("model_parallel")
def test_lora_wraps_every_local_layer_and_trains_only_its_adapters():
    from megatron.core.models.gpt import GPTModel
    from nemo.collections import llm
    from nemo.collections.llm import fn
    from nemo.collections.llm.peft.lora import LoRALinear

    from ghsweep.train.nemo.compat import allow_lora_without_te, use_local_spec
    from ghsweep.train.nemo.recipe import transformer_engine_available
    from ghsweep.train.nemo.torch_core_attention import local_layer_spec

    assert not transformer_engine_available(), "this test is about an environment without Transformer Engine"
    torch.manual_seed(0)
    config = llm.LlamaConfig(
        num_layers=2,
        hidden_size=HIDDEN,
        ffn_hidden_size=FFN,
        num_attention_heads=4,
        num_query_groups=4,
        use_cpu_initialization=True,
        apply_rope_fusion=False,  # checked on construction; use_local_spec sets it again with the rest
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
    )
    use_local_spec(config)
    model = GPTModel(config, transformer_layer_spec=local_layer_spec(config), vocab_size=256, max_sequence_length=64)
    model.requires_grad_(False)  # what NeMo's PEFT callback does before its transform

    allow_lora_without_te()
    lora = llm.peft.LoRA(target_modules=list(LAYER_SHAPES), dim=RANK)
    model = fn.walk(model, lora.transform)

    for layer in model.decoder.layers:
        for name, (fan_in, fan_out) in LAYER_SHAPES.items():
            block = "self_attention" if name in ("linear_qkv", "linear_proj") else "mlp"
            wrapped = layer.get_submodule(f"{block}.{name}")
            assert isinstance(wrapped, LoRALinear), name
            trainable = {n: p.numel() for n, p in wrapped.named_parameters() if p.requires_grad}
            assert trainable == {"adapter.linear_in.weight": RANK * fan_in, "adapter.linear_out.weight": fan_out * RANK}

    # LoRA's B starts at zero: the wrapped layer computes what the frozen one does, and only the
    # adapter's matrices receive gradients.
    qkv = model.decoder.layers[0].self_attention.linear_qkv
    x = torch.randn(8, 1, HIDDEN)
    out, _ = qkv(x)
    torch.testing.assert_close(out, qkv.to_wrap(x)[0])
    out.square().sum().backward()
    assert {n for n, p in qkv.named_parameters() if p.grad is not None} == {
        "adapter.linear_in.weight",
        "adapter.linear_out.weight",
    }


@pytest.mark.usefixtures("model_parallel")
def test_a_checkpoint_is_converted_onto_the_local_layers_in_its_own_shape(tmp_path, hf_folder):  # noqa: F811
    import fiddle as fdl
    from transformers import AutoModelForCausalLM

    from ghsweep.train.nemo.recipe import build_recipe, llama_folder_importer
    from ghsweep.train.nemo.torch_core_attention import local_layer_spec
    from tests.support.nemo_recipes import nemo_typed

    recipe = build_recipe(nemo_typed(f"model.path={hf_folder}", "train.seq_length=256"), tmp_path)
    importer = llama_folder_importer(str(hf_folder), fdl.build(recipe.model.config))
    # What the importer's apply does before saving, without the GPU its save needs.
    target = importer.init()
    config = target.config
    assert (config.num_layers, config.hidden_size, config.ffn_hidden_size) == (2, 64, 176)
    assert config.transformer_layer_spec is local_layer_spec
    # NeMo's Llama default, which fails without Transformer Engine ("apply_rope_fusion is not available").
    assert config.apply_rope_fusion is False
    config.use_cpu_initialization = True  # this test's only change: no GPU here
    target.configure_model()
    source = AutoModelForCausalLM.from_pretrained(hf_folder)
    converted = dict(importer.convert_state(source, target).named_parameters())

    def nemo(name: str) -> torch.Tensor:
        return next(p for n, p in converted.items() if n.endswith(name))

    layer = source.model.layers[1]
    torch.testing.assert_close(nemo("embedding.word_embeddings.weight"), source.model.embed_tokens.weight)
    torch.testing.assert_close(
        nemo("decoder.layers.1.self_attention.linear_proj.weight"), layer.self_attn.o_proj.weight
    )
    # The norms NeMo maps onto Transformer Engine's fused layers only: the checkpoint's, not 1.0.
    for ours, theirs in (("input_layernorm", "input_layernorm"), ("pre_mlp_layernorm", "post_attention_layernorm")):
        assert not torch.all(getattr(layer, theirs).weight == 1)
        torch.testing.assert_close(nemo(f"decoder.layers.1.{ours}.weight"), getattr(layer, theirs).weight)


def test_nemo_s_auto_tokenizer_is_serialisable_into_a_checkpoint_context(hf_folder):  # noqa: F811
    from fiddle._src.experimental import serialization
    from nemo.collections.common.tokenizers import AutoTokenizer

    from ghsweep.train.nemo.compat import track_nemo_auto_tokenizer

    track_nemo_auto_tokenizer()
    track_nemo_auto_tokenizer()  # twice, as two runs in one process would: still one registration
    tokenizer = AutoTokenizer(str(hf_folder))
    # What NeMo's checkpoint save does with the model's tokenizer: its recorded arguments, as JSON.
    config = tokenizer.__io__
    assert str(hf_folder) in serialization.dump_json(config)
