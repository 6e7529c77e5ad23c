"""The AdamW Triton kernel (ghsweep/train/adamw_kernel.py): on CPU through Triton's interpreter, on a
GPU compiled. Its arithmetic is torchao's `single_param_adam`, its rounding unbiased."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

from tests.optional_env import unavailable

HYPER = {"betas": (0.9, 0.999), "eps": 1e-8}


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def kernel(request) -> tuple[str, Callable]:
    try:
        from ghsweep.train.adamw_kernel import adamw_step
    except ImportError as exc:
        unavailable(f"{exc}: `pip install triton` (torch's CUDA builds bring it)")
    if request.param == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter runs where CUDA is not (tests/conftest.py); here the cuda variant runs")
    return request.param, adamw_step


def test_kernel_steps_like_torchao_on_fp32_weights(kernel):
    """Nothing to round in fp32: three steps with weight decay and a folded clip divisor end where
    torchao's AdamW arithmetic ends, over a length that leaves a ragged last block."""
    from torchao.optim.adam import single_param_adam

    device, adamw_step = kernel
    torch.manual_seed(0)
    n = 10_003
    weights, grad = torch.randn(n, device=device) * 0.02, torch.randn(n, device=device) * 1e-3
    exp_avg, exp_avg_sq = torch.zeros_like(weights), torch.zeros_like(weights)
    ref, ref_avg, ref_avg_sq = weights.clone(), exp_avg.clone(), exp_avg_sq.clone()
    divisor = torch.tensor(2.0, device=device)
    for step in range(1, 4):
        adamw_step(
            weights, grad, exp_avg, exp_avg_sq, step=step, lr=1e-3, weight_decay=0.01, grad_divisor=divisor,
            seed=step, **HYPER,
        )  # fmt: skip
        single_param_adam(
            ref, grad / divisor, torch.tensor(float(step)), ref_avg, ref_avg_sq, None, torch.tensor(1e-3),
            0.9, 0.999, 0.01, 1e-8, True, False,
        )  # fmt: skip
    torch.testing.assert_close(weights, ref)
    torch.testing.assert_close(exp_avg, ref_avg)
    torch.testing.assert_close(exp_avg_sq, ref_avg_sq)


def _steps(adamw_step: Callable, start: torch.Tensor, grads: list[torch.Tensor], seed: int) -> torch.Tensor:
    """30 steps at Llama-2-7B full fine-tuning's rate (5e-6), in `start`'s dtype."""
    weights = start.clone()
    exp_avg, exp_avg_sq = torch.zeros_like(weights), torch.zeros_like(weights)
    for step, grad in enumerate(grads, start=1):
        adamw_step(
            weights, grad.to(weights.dtype), exp_avg, exp_avg_sq, step=step, lr=5e-6, weight_decay=0.0,
            grad_divisor=None, seed=seed + step, **HYPER,
        )  # fmt: skip
    return weights


def test_bf16_rounding_lands_the_whole_update_in_expectation(kernel):
    """Weights drawn like a Llama layer's, N(0, 0.02): a bf16 step of 5e-6 is under half their last
    bit, yet the share of the fp32 run's update that reaches them is 1 (torch's AdamW lands 7%,
    test_optim.py)."""
    device, adamw_step = kernel
    torch.manual_seed(0)
    start = (torch.randn(1 << 16, device=device) * 0.02).bfloat16()
    grads = [torch.randn(1 << 16, device=device) * 1e-3 + 1e-3 for _ in range(30)]  # a direction, and noise
    moved = _steps(adamw_step, start, grads, seed=100).float() - start.float()
    reference = _steps(adamw_step, start.float(), grads, seed=100) - start.float()
    assert float((moved * reference.sign()).sum() / reference.abs().sum()) == pytest.approx(1.0, abs=0.02)


def test_rounding_follows_the_seed_and_stays_between_neighbours(kernel):
    """The seed alone decides the rounding (data-parallel replicas step alike), and each weight lands
    on one of the two bf16 values around its fp32 result."""
    device, adamw_step = kernel
    torch.manual_seed(0)
    start = (torch.randn(1 << 14, device=device) * 0.02).bfloat16()
    grads = [torch.randn(1 << 14, device=device) * 1e-3]
    first, again, other = (_steps(adamw_step, start, grads, seed) for seed in (7, 7, 8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    exact = _steps(adamw_step, start.float(), grads, seed=7).view(torch.int32)
    toward_zero = exact & -65536  # the 16 bits bf16 drops, cleared
    landed = first.float().view(torch.int32)
    assert bool(((landed == toward_zero) | (landed == toward_zero + 0x10000)).all())
    assert 0 < float((landed != toward_zero).float().mean()) < 1


def test_strided_tensors_are_refused(kernel):
    _, adamw_step = kernel
    weights = torch.zeros(8, 8).t()
    with pytest.raises(ValueError, match="contiguous"):
        adamw_step(
            weights, weights, weights, weights, step=1, lr=1e-3, weight_decay=0.0, grad_divisor=None, seed=0,
            **HYPER,
        )  # fmt: skip


def test_the_step_writes_the_fp8_copy_of_the_weight_it_writes(kernel):
    """A weight trained in fp8 (fp8_cached.TrainedFp8Linear): the same step also writes the new
    weight's E4M3 copy, scaled by the amax before the step as fp8_cached._quantise scales (on CPU
    only the scales: Triton's interpreter rounds fp8 its own way), gathers the new amax into the
    next slot of the ring and clears the one after it."""
    from torch import nn

    from ghsweep.train.fp8_cached import E4M3, TrainedFp8Linear, _quantise

    device, adamw_step = kernel
    torch.manual_seed(0)
    layer = TrainedFp8Linear(nn.Linear(96, 1000, bias=False, dtype=torch.bfloat16, device=device))
    plain = layer.weight.detach().clone()
    for step in (1, 2):
        grad = torch.randn_like(plain) * 1e-2
        before = layer.weight.detach().abs().amax().float()
        layer.amax[(step + 1) % 3] = 123.0  # stale: the kernel must clear it
        with torch.no_grad():
            states = [torch.zeros_like(plain) for _ in range(4)]
            hyper = dict(step=step, lr=1e-2, weight_decay=0.0, grad_divisor=None, seed=7, **HYPER)
            adamw_step(layer.weight.data, grad, *states[:2], fp8_cast=layer.fused_cast(), **hyper)
            adamw_step(plain, grad, *states[2:], **hyper)
        assert torch.equal(layer.weight, plain)  # the weight's own step is unchanged
        assert layer.amax[step % 3] == plain.abs().amax().float() and layer.amax[step % 3] != before
        assert layer.amax[(step + 1) % 3] == 0.0
        expected, scale = _quantise(plain, E4M3, amax=before)
        assert torch.equal(layer.scale, scale)
        if device == "cuda":
            assert torch.equal(layer.weight_fp8.view(torch.uint8), expected.view(torch.uint8))
