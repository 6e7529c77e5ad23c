"""fp8 GEMMs for frozen weights (the LoRA base model), with the weights quantised once.

Current scaling recomputes a weight's fp8 copy from its amax every step, in forward and again in
backward; for a frozen weight that copy never changes, so it is made once (E4M3, one scale per
tensor, the same numbers torchao's tensorwise scaling makes each step) and kept in both layouts the
fp8 GEMMs need. The bf16 weight is dropped, so memory stays that of the bf16 base. Activations are
scaled per tensor from their current amax (E4M3 forward, E5M2 gradients: the hybrid format), and
no weight gradient is computed, so nothing is saved for backward.
"""

from __future__ import annotations

import torch
from torch import nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _quantise(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in fp8, its scale): x ~ fp8 * scale, the tensor's amax mapped to the format's largest value."""
    scale = x.abs().amax().float().clamp(min=1e-12) / torch.finfo(dtype).max
    return (x / scale).clamp(torch.finfo(dtype).min, torch.finfo(dtype).max).to(dtype), scale


class _FrozenFp8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x: torch.Tensor, weight: torch.Tensor, weight_t: torch.Tensor, scale: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(weight_t, scale)
        x2d = x.reshape(-1, x.shape[-1])
        x8, x_scale = _quantise(x2d, E4M3)
        # _scaled_mm takes its second operand column-major: weight.t() of the row-major (out, in) copy.
        y = torch._scaled_mm(x8, weight.t(), scale_a=x_scale, scale_b=scale, out_dtype=x.dtype, use_fast_accum=True)
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weight_t, scale = ctx.saved_tensors
        g2d = grad.reshape(-1, grad.shape[-1])
        g8, g_scale = _quantise(g2d, E5M2)
        grad_x = torch._scaled_mm(g8, weight_t.t(), scale_a=g_scale, scale_b=scale, out_dtype=grad.dtype)
        return grad_x.reshape(*grad.shape[:-1], weight_t.shape[0]), None, None, None


class FrozenFp8Linear(nn.Module):
    """A bias-free linear layer whose frozen weight lives in fp8 only."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if linear.bias is not None or linear.weight.requires_grad:
            raise ValueError("FrozenFp8Linear takes a frozen linear layer without bias")
        self.in_features: int = linear.in_features
        self.out_features: int = linear.out_features
        weight, scale = _quantise(linear.weight.detach(), E4M3)
        self.register_buffer("weight_fp8", weight)
        self.register_buffer("weight_fp8_t", weight.t().contiguous())
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FrozenFp8Matmul.apply(x, self.weight_fp8, self.weight_fp8_t, self.scale)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 weight"


def freeze_to_fp8(model: nn.Module, is_target) -> int:
    """Replace every frozen target linear layer (`is_target(name, module)`) in place; returns how many."""
    swapped = 0
    for name, module in list(model.named_modules()):
        if is_target(name, module) and not module.weight.requires_grad and module.bias is None:
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, FrozenFp8Linear(module))
            swapped += 1
    return swapped
