"""LoRA's adapter GEMMs joined to the base layer's (peft.adapter_gemms=joined): the same outputs and
gradients as peft's layers, the same training after optimizer steps, and refusals where they cannot join."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ghsweep.train.fp8_cached import FrozenFp8Linear
from ghsweep.train.lora_joined import JoinedLoraLinear, join_adapters, refresh
from ghsweep.train.model import apply_peft, build_model
from ghsweep.train.optimizer import make_optimizer
from ghsweep.train.tokenizer import load_tokenizer
from tests.support.compose import compose_typed


def lora_model(dtype: torch.dtype, *overrides: str) -> nn.Module:
    """The tiny Llama in LoRA, its B matrices random (peft starts them at zero, which would hide B's
    part of every output and gradient)."""
    config = compose_typed("model=tiny_llama", "peft.r=4", *overrides)
    torch.manual_seed(0)
    model, _ = build_model(config.model, load_tokenizer(config), torch.device("cpu"), dtype)
    model = apply_peft(model, config.peft, dtype)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            nn.init.normal_(parameter, std=0.05)
    return model


def adapters_by_place(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each adapter parameter under one name for both layouts (peft's `q_proj.lora_A.default.weight`,
    ours `q_proj.lora_A`)."""
    return {
        name.replace(".default.weight", ""): parameter
        for name, parameter in model.named_parameters()
        if parameter.requires_grad
    }


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def loss_of(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=input_ids, labels=input_ids).loss


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_joined_layers_give_peft_s_loss_and_gradients(dtype, tolerance):
    peft_model = lora_model(dtype)
    joined_model = copy.deepcopy(peft_model)
    layers = join_adapters(joined_model, "joined")
    # tiny_llama: 4 layers x 7 projections, every base weight now only in a joined buffer.
    assert len(layers) == 28 and all(isinstance(layer, JoinedLoraLinear) for layer in layers)
    assert not any("base_layer" in name for name, _ in joined_model.named_parameters())
    input_ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    expected, got = loss_of(peft_model, input_ids), loss_of(joined_model, input_ids)
    assert abs(got.item() - expected.item()) <= tolerance * abs(expected.item())
    expected.backward()
    got.backward()
    peft_grads, joined_grads = adapters_by_place(peft_model), adapters_by_place(joined_model)
    assert sorted(peft_grads) == sorted(joined_grads) and len(joined_grads) == 56
    for name, parameter in joined_grads.items():
        # The first layer's input needs no gradient: its adapters' gradients come from the thin GEMMs alone.
        assert relative_error(parameter.grad, peft_grads[name].grad) < tolerance, name


def test_the_buffers_follow_the_adapters_through_optimizer_steps():
    peft_model = lora_model(torch.float32)
    joined_model = copy.deepcopy(peft_model)
    layers = join_adapters(joined_model, "joined")
    train = compose_typed("model=tiny_llama").train
    optimizers = [
        make_optimizer([p for p in model.parameters() if p.requires_grad], train, torch.device("cpu"))[0]
        for model in (peft_model, joined_model)
    ]
    input_ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(2))
    losses: list[tuple[float, float]] = []
    for _ in range(3):
        pair = []
        for model, optimizer in zip((peft_model, joined_model), optimizers):
            loss = loss_of(model, input_ids)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            pair.append(loss.item())
        refresh(layers)
        losses.append((pair[0], pair[1]))
    assert losses[0][0] != losses[-1][0]  # the adapters trained
    for expected, got in losses:
        assert got == pytest.approx(expected, rel=1e-5)
    for layer in layers:
        a_slot, b_slot = layer.adapter_slots()
        assert torch.equal(a_slot, layer.lora_A) and torch.equal(b_slot, layer.lora_B)


def test_without_a_refresh_the_joined_gemm_still_reads_the_old_adapter():
    """What refresh is for: the base GEMM reads A's copy in the buffer, which a step alone leaves behind."""
    model = lora_model(torch.float32)
    (layer, *_) = join_adapters(model, "joined")
    x = torch.randn(3, layer.in_features)
    before = layer(x)
    with torch.no_grad():
        layer.lora_A.add_(1.0)
    assert torch.equal(layer(x), before)
    refresh([layer])
    assert not torch.allclose(layer(x), before)


@pytest.mark.cli  # Inductor compiles the layer's C++ kernels with the system's compiler
def test_a_compiled_joined_layer_computes_what_the_eager_one_does():
    layer = join_adapters(lora_model(torch.float32), "joined")[0]
    x = torch.randn(2, 8, layer.in_features, requires_grad=True)
    x_compiled = x.detach().clone().requires_grad_(True)
    eager = layer(x)
    compiled = torch.compile(layer)(x_compiled)
    torch.testing.assert_close(compiled, eager)
    grad = torch.randn_like(eager)
    eager.backward(grad)
    compiled.backward(grad)
    torch.testing.assert_close(x_compiled.grad, x.grad)


def test_auto_leaves_layers_that_cannot_join_to_peft_and_joined_names_them():
    with_dropout = lora_model(torch.float32, "peft.dropout=0.1")
    assert join_adapters(copy.deepcopy(with_dropout), "auto") == []
    with pytest.raises(ValueError, match=r"peft.adapter_gemms=joined: .*q_proj peft.dropout > 0.*auto, separate"):
        join_adapters(with_dropout, "joined")
    # An fp8 base layer (precision=fp8) holds fp8 weights that no bf16 adapter can join.
    fp8_base = lora_model(torch.bfloat16)
    q_proj = fp8_base.get_submodule("base_model.model.model.layers.0.self_attn.q_proj")
    q_proj.base_layer = FrozenFp8Linear(q_proj.base_layer)
    assert len(join_adapters(copy.deepcopy(fp8_base), "auto")) == 27
    with pytest.raises(ValueError, match="FrozenFp8Linear, not a plain linear layer"):
        join_adapters(fp8_base, "joined")
    assert join_adapters(lora_model(torch.float32), "separate") == []
