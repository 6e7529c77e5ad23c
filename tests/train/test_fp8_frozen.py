"""fp8 GEMMs over frozen weights quantised once: outputs and input gradients follow bf16."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ghsweep.train.fp8_frozen import FrozenFp8Linear, freeze_to_fp8


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
