"""One AdamW step of a tensor in a single Triton kernel, bf16 weights rounded stochastically.

torchao's AdamW computes the same step (torchao_adamw.py), but its stochastic rounding draws one
64-bit Philox number per element (`torch.randint`, which inductor lowers to `randint64`). On an
H200 its step over Llama-2-7B's 6.7 B parameters took 34-39 ms alone and 57 ms inside training,
where copying the bytes the step moves (14 a parameter: weight, gradient and two states) takes
22 ms. Here one Philox call gives four 32-bit numbers, 16 random bits for each of 8 elements, and
the step takes 24 ms (`python -m ghsweep.bench.optimizer_step`).

The arithmetic is torchao's `single_param_adam` (AdamW): decoupled weight decay, states kept in the
weight's dtype (rounded to nearest, as torchao and torch do), the update from the fp32 states
before they are rounded, and the gradient divided by the folded clip's divisor when there is one.

With `fp8_cast` (a weight trained in fp8, fp8_cached.py) the kernel also writes the new weight's
fp8 copy (E4M3, scaled by the amax the weight had before the step) and gathers its new amax.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from ghsweep.train.fp8_cached import Fp8Cast

# Each program steps BLOCK rows of 8 elements, with one Philox call a row (4 x 32 random bits). On an
# H200, over Llama-2-7B's tensors, 256 rows step faster than 512 (fewer registers a thread): 24.0
# against 24.7 ms, and 27.5 against 31.3 ms with the fp8 copy; more rows a program (a loop over
# tiles, to gather the amax with fewer atomics) and more warps were slower.
BLOCK = 256


@triton.jit(do_not_specialize=["seed"])
def _adamw_kernel(
    p_ptr, g_ptr, m_ptr, v_ptr, n, divisor_ptr, seed,
    lr, beta1, beta2, eps, decay, bias1, bias2_sqrt,
    fp8_ptr, scale_ptr, amax_read_ptr, amax_gather_ptr, amax_zero_ptr,
    HAS_DIVISOR: tl.constexpr, STOCHASTIC: tl.constexpr, CAST_FP8: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    column = tl.arange(0, 8)[None, :]
    offs = rows[:, None] * 8 + column
    mask = offs < n
    p = tl.load(p_ptr + offs, mask=mask).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    if HAS_DIVISOR:
        g = g / tl.load(divisor_ptr).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask).to(tl.float32)
    p = p - lr * decay * p
    m = m + (1.0 - beta1) * (g - m)
    v = v + (1.0 - beta2) * (g * g - v)
    tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty), mask=mask)
    p = p - lr * (m / bias1) / (tl.sqrt(v) / bias2_sqrt + eps)
    if STOCHASTIC:
        # 16 random bits an element: a row's 8 elements share one Philox call's 128 bits.
        r0, r1, r2, r3 = tl.randint4x(seed, rows)
        r = tl.where(
            column < 4, tl.where(column < 2, r0[:, None], r1[:, None]), tl.where(column < 6, r2[:, None], r3[:, None])
        )
        rand16 = tl.where(column % 2 == 0, r & 0xFFFF, r >> 16).to(tl.int32)
        # Round away from zero with the probability of the 16 bits bf16 drops (torchao's rule).
        bits = p.to(tl.int32, bitcast=True)
        truncated = bits & -65536
        bits = tl.where(rand16 < (bits & 0xFFFF), truncated + 0x10000, truncated)
        p = bits.to(tl.float32, bitcast=True)
    p = p.to(p_ptr.dtype.element_ty)
    tl.store(p_ptr + offs, p, mask=mask)
    if CAST_FP8:
        w = p.to(tl.float32)
        # fp8_cached._quantise's (torchao's) arithmetic: the scale from the amax in fp64, the cast of
        # w times it in fp32, the dequantisation scale its correctly rounded reciprocal.
        # 448: E4M3's largest finite value.
        amax = tl.maximum(tl.load(amax_read_ptr).to(tl.float64), 1e-12)
        inverse = (448.0 / amax).to(tl.float32)
        w8 = tl.clamp(w * inverse, -448.0, 448.0).to(tl.float8e4nv)
        tl.store(fp8_ptr + offs, w8, mask=mask)
        tl.atomic_max(amax_gather_ptr, tl.max(tl.max(tl.where(mask, tl.abs(w), 0.0), axis=1), axis=0))
        if tl.program_id(0) == 0:
            tl.store(scale_ptr, tl.math.div_rn(1.0, inverse))
            tl.store(amax_zero_ptr, 0.0)


def adamw_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    step: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    grad_divisor: torch.Tensor | None,
    seed: int,
    fp8_cast: Fp8Cast | None = None,
) -> None:
    """Step `param` in place (its states too); bf16 weights are rounded stochastically with `seed`.
    With `fp8_cast`, also write the new weight's fp8 copy there."""
    for tensor in (param, grad, exp_avg, exp_avg_sq, *((fp8_cast.weight_fp8,) if fp8_cast else ())):
        if not tensor.is_contiguous():
            raise ValueError("adamw_step steps contiguous tensors only")
    beta1, beta2 = betas
    n = param.numel()
    grid = (triton.cdiv(n, 8 * BLOCK),)
    if fp8_cast is None:
        fp8_args = (param,) * 5  # unread: CAST_FP8 is off
    else:
        amax, slot = fp8_cast.amax, fp8_cast.slot
        fp8_args = (fp8_cast.weight_fp8, fp8_cast.scale, amax[slot % 3], amax[(slot + 1) % 3], amax[(slot + 2) % 3])
    _adamw_kernel[grid](
        param, grad, exp_avg, exp_avg_sq, n,
        grad_divisor if grad_divisor is not None else param, seed,
        lr, beta1, beta2, eps, weight_decay, 1 - beta1**step, (1 - beta2**step) ** 0.5,
        *fp8_args,
        HAS_DIVISOR=grad_divisor is not None, STOCHASTIC=param.dtype == torch.bfloat16,
        CAST_FP8=fp8_cast is not None, BLOCK=BLOCK,
    )  # fmt: skip
