"""backend=nemo without Transformer Engine: NeMo's LoRA wraps Megatron's local layers
(ghsweep.train.nemo.without_te), checked on CPU on a 2-layer Llama-shaped GPTModel."""

from __future__ import annotations

import socket

import pytest
import torch

from tests.nemo import nemo_llm  # noqa: F401  (the fixture)

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

    from ghsweep.train.nemo.attention import local_layer_spec
    from ghsweep.train.nemo.recipe import transformer_engine_available
    from ghsweep.train.nemo.without_te import allow_lora_without_te

    assert not transformer_engine_available(), "this test is about an environment without Transformer Engine"
    torch.manual_seed(0)
    config = llm.LlamaConfig(
        num_layers=2,
        hidden_size=HIDDEN,
        ffn_hidden_size=FFN,
        num_attention_heads=4,
        num_query_groups=4,
        use_cpu_initialization=True,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
    )
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
