"""fp8 GEMMs over weights cast outside them: frozen weights quantised once, trained ones once a step.
Outputs and gradients follow bf16 and torchao's tensorwise recipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from ghsweep.train.fp8_cached import E4M3, FrozenFp8Linear, TrainedFp8Linear, freeze_to_fp8, train_in_fp8


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_frozen_fp8_linear_follows_the_bf16_layer():
    torch.manual_seed(0)
    linear = nn.Linear(256, 128, bias=False, dtype=torch.bfloat16).requires_grad_(False)
    x = torch.randn(2, 16, 256, dtype=torch.bfloat16, requires_grad=True)
    x8 = x.detach().clone().requires_grad_(True)
    fp8 = FrozenFp8Linear(linear)
    y, y8 = linear(x), fp8(x8)
    assert y8.shape == y.shape and y8.dtype == torch.bfloat16
    assert _relative_error(y8, y) < 0.08  # E4M3 keeps 3 mantissa bits
    grad = torch.randn_like(y)
    y.backward(grad)
    y8.backward(grad)
    assert _relative_error(x8.grad, x.grad) < 0.15  # E5M2 gradients: 2 mantissa bits
    assert list(fp8.parameters()) == []  # no weight left to train or to keep in bf16


def test_only_frozen_bias_free_targets_are_swapped():
    model = nn.Sequential(nn.Linear(32, 32, bias=False), nn.Linear(32, 32, bias=False), nn.Linear(32, 32))
    model[1].weight.requires_grad_(False)
    model[2].requires_grad_(False)
    assert freeze_to_fp8(model, lambda name, m: isinstance(m, nn.Linear)) == 1
    assert isinstance(model[1], FrozenFp8Linear)
    assert isinstance(model[0], nn.Linear) and isinstance(model[2], nn.Linear)


def test_refuses_a_trained_weight():
    with pytest.raises(ValueError, match="frozen"):
        FrozenFp8Linear(nn.Linear(16, 16, bias=False))


def test_trained_fp8_linear_computes_torchao_s_tensorwise_recipe():
    """Same quantisation as torchao's Float8Linear (tensorwise: E4M3 forward, E5M2 gradients): the
    same outputs and gradients, up to the order of accumulation, for the input and the weight."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    torch.manual_seed(0)
    linear = nn.Linear(256, 128, bias=False, dtype=torch.bfloat16)
    reference = Float8Linear.from_float(copy_of(linear), Float8LinearConfig(emulate=True))
    ours = TrainedFp8Linear(copy_of(linear))
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    x_ref, x_ours = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y_ref, y_ours = reference(x_ref), ours(x_ours)
    assert _relative_error(y_ours, y_ref) < 0.01
    assert _relative_error(y_ours, linear(x)) < 0.08  # and E4M3's distance from bf16
    grad = torch.randn_like(y_ref)
    y_ref.backward(grad)
    y_ours.backward(grad)
    assert _relative_error(x_ours.grad, x_ref.grad) < 0.01
    assert ours.weight.grad is not None and ours.weight.grad.dtype == torch.bfloat16
    assert _relative_error(ours.weight.grad, reference.weight.grad) < 0.01
    assert [name for name, _ in ours.named_parameters()] == ["weight"]
    assert list(ours.state_dict()) == ["weight"]  # nn.Linear's checkpoint keys


def copy_of(linear: nn.Linear) -> nn.Linear:
    twin = nn.Linear(linear.in_features, linear.out_features, bias=False, dtype=linear.weight.dtype)
    twin.load_state_dict(linear.state_dict())
    return twin


def test_a_cast_remakes_the_copy_from_the_stepped_weight_and_keeps_the_amax_ring():
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import GemmInputRole, LinearMMConfig

    torch.manual_seed(0)
    layer = TrainedFp8Linear(nn.Linear(64, 32, bias=False, dtype=torch.bfloat16))
    assert layer.amax.tolist()[1:] == [0.0, 0.0] and layer.amax[0] == layer.weight.abs().max().float()
    with torch.no_grad():
        layer.weight.mul_(3.0)
    stale = layer.weight_fp8.clone()
    layer.cast()
    amax = layer.weight.abs().max().float()
    torchao_fp8 = hp_tensor_to_float8_dynamic(
        layer.weight.detach(), E4M3, LinearMMConfig(), gemm_input_role=GemmInputRole.WEIGHT
    )
    assert torch.equal(layer.weight_fp8.view(torch.uint8), torchao_fp8._data.view(torch.uint8))
    assert torch.equal(layer.scale, torchao_fp8._scale.reciprocal())
    assert not torch.equal(stale.view(torch.uint8), layer.weight_fp8.view(torch.uint8))
    # Cast 1 leaves its amax in slot 1 and slot 2 cleared for the next fused cast to gather into.
    assert layer.casts == 1 and layer.amax[1] == amax and layer.amax[2] == 0.0
    cast = layer.fused_cast()
    assert (cast.slot, layer.casts) == (1, 2) and cast.weight_fp8 is layer.weight_fp8


def test_only_trained_bias_free_targets_train_in_fp8():
    model = nn.Sequential(nn.Linear(32, 32, bias=False), nn.Linear(32, 32, bias=False), nn.Linear(32, 32))
    model[1].weight.requires_grad_(False)
    assert train_in_fp8(model, lambda name, m: isinstance(m, nn.Linear)) == 1
    assert isinstance(model[0], TrainedFp8Linear)
    assert isinstance(model[1], nn.Linear) and isinstance(model[2], nn.Linear)
    with pytest.raises(ValueError, match="trained"):
        TrainedFp8Linear(model[1])


# A compiled layer of a frozen fp8 GEMM and a trained bf16 adapter, under training's compile settings;
# prints what AOTAutograd's cache did with its graph and the input's gradient.
COMPILED_FP8_LAYER = """
import json, sys, torch
import torch._dynamo.utils as dynamo_utils
from torch import nn
from ghsweep.train.fp8_cached import FrozenFp8Linear
from ghsweep.train.torch_train import compile_settings

class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = FrozenFp8Linear(nn.Linear(64, 64, bias=False, dtype=torch.bfloat16).requires_grad_(False))
        self.adapter = nn.Linear(64, 64, bias=False, dtype=torch.bfloat16)

    def forward(self, x):
        return torch.relu(self.base(x) + self.adapter(x))

torch.manual_seed(0)
layer = Layer()
layer.compile()
x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
with torch._functorch.config.patch(**compile_settings(1.0, x.device)):
    layer(x).square().mean().backward()
print(json.dumps({"cache": dict(dynamo_utils.counters["aot_autograd"]), "grad": x.grad.float().sum().item()}))
"""


def test_a_compiled_fp8_layer_is_kept_by_aotautograd_s_cache_for_the_next_worker(tmp_path):
    """fp8's GEMM is a custom autograd.Function, which AOTAutograd's cache bypasses by default: every
    worker traced and partitioned the joint graph again. Under training's settings the first worker
    saves it and the next loads it, with the same gradients."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}

    def worker() -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", COMPILED_FP8_LAYER], env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first, second = worker(), worker()
    assert first["cache"].get("autograd_cache_saved") == 1 and "autograd_cache_bypass" not in first["cache"], first
    assert second["cache"].get("autograd_cache_hit") == 1, second
    assert second["grad"] == first["grad"]


def test_the_amax_taken_by_rows_is_the_tensor_s_and_quantises_the_same_bytes():
    """_quantise reduces each row first (for Inductor's sake): max is exact, so the scale and the fp8 bytes
    are those of one reduction over the whole tensor, for activations (E4M3) and gradients (E5M2)."""
    from ghsweep.train.fp8_cached import E5M2, _quantise

    torch.manual_seed(0)
    x = torch.randn(64, 300, dtype=torch.bfloat16) * torch.logspace(-3, 3, 300, dtype=torch.bfloat16)
    for dtype in (E4M3, E5M2):
        got, scale = _quantise(x, dtype)
        expected, expected_scale = _quantise(x, dtype, x.abs().amax())
        assert torch.equal(scale, expected_scale)
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
