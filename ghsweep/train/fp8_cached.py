"""fp8 GEMMs whose weights are cast to fp8 outside the GEMMs: frozen ones once, trained ones once a step.

torchao's tensorwise (current) scaling casts each weight from its amax inside every forward, and
again, transposed, in backward: about 8 bytes of memory traffic a weight element a step, 14 ms of
Llama-2-7B's fp8 full fine-tuning step on an H200. A weight changes only in the optimizer step, so
its fp8 copy is made there:

- A frozen weight (the LoRA base) is quantised once and kept in both layouts the fp8 GEMMs need;
  the bf16 weight is dropped, so memory stays that of the bf16 base.
- A trained weight keeps its bf16 parameter (the optimizer steps it) and an fp8 copy, remade after
  every optimizer step (`TrainedFp8Linear.cast`). adamw_sr's kernel writes the copy in the same
  pass that writes the weight (adamw_kernel.py); it then scales by the weight's amax before the
  step, which the step moves by about the learning rate (TE's delayed scaling, one step of history),
  saturating at E4M3's largest value; the new amax is gathered in the same pass. Other optimizers
  cast after their step from the current amax. Backward transposes the fp8 copy.

Both use one scale per tensor (E4M3) as torchao's tensorwise recipe does; activations are scaled
per tensor from their current amax (E4M3 forward, E5M2 gradients: the hybrid format), fast
accumulation in forward only (torchao's defaults).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _quantise(
    x: torch.Tensor, dtype: torch.dtype, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in fp8, its dequantisation scale: x ~ fp8 * scale), the tensor's amax mapped to the format's
    largest value. The arithmetic is torchao's (amax_to_scale, then a saturated cast of x * 1/scale in
    fp32), so the fp8 bytes are the ones torchao's tensorwise recipe makes."""
    if amax is None:
        # Each row's amax, then theirs: the same number, which Inductor reduces in the kernel that makes the row,
        # where a reduction over the whole tensor took a pass of its own. One H200, 4096 tokens, compiled
        # (benchmarks/fp8_scaling.py): SiLU(gate) * up of 11,008 columns quantised 0.291 -> 0.150 ms.
        amax = x.abs().amax(dim=-1).amax()
    inverse = (torch.finfo(dtype).max / amax.double().clamp(min=1e-12)).float()
    x8 = (x.float() * inverse).clamp(torch.finfo(dtype).min, torch.finfo(dtype).max).to(dtype)
    return x8, inverse.reciprocal()


def _column_major(x: torch.Tensor) -> torch.Tensor:
    # _scaled_mm takes its second operand column-major.
    return x.t().contiguous().t()


class _Fp8Matmul(torch.autograd.Function):
    """x @ weight.T with the weight given in fp8 (`weight_fp8`, and transposed as `weight_fp8_t` when
    kept); `weight` is the trained bf16 parameter that receives the gradient, or None."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        weight_fp8: torch.Tensor,
        weight_fp8_t: torch.Tensor | None,
        scale: torch.Tensor,
    ) -> torch.Tensor:
        x2d = x.reshape(-1, x.shape[-1])
        x8, x_scale = _quantise(x2d, E4M3)
        # weight_fp8 is row-major (out, in): its .t() is the column-major (in, out) operand.
        y = torch._scaled_mm(x8, weight_fp8.t(), scale_a=x_scale, scale_b=scale, out_dtype=x.dtype, use_fast_accum=True)
        trains_weight = weight is not None and weight.requires_grad
        ctx.weight_dtype = None if weight is None else weight.dtype
        ctx.save_for_backward(weight_fp8, weight_fp8_t, scale, *((x8, x_scale) if trains_weight else ()))
        return y.reshape(*x.shape[:-1], weight_fp8.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weight_fp8, weight_fp8_t, scale, *saved_input = ctx.saved_tensors
        g2d = grad.reshape(-1, grad.shape[-1])
        g8, g_scale = _quantise(g2d, E5M2)
        weight_column_major = _column_major(weight_fp8) if weight_fp8_t is None else weight_fp8_t.t()
        grad_x = torch._scaled_mm(g8, weight_column_major, scale_a=g_scale, scale_b=scale, out_dtype=grad.dtype)
        grad_weight = None
        if saved_input:
            x8, x_scale = saved_input
            grad_weight = torch._scaled_mm(
                g8.t().contiguous(), _column_major(x8), scale_a=g_scale, scale_b=x_scale, out_dtype=ctx.weight_dtype
            )
        return grad_x.reshape(*grad.shape[:-1], weight_fp8.shape[1]), grad_weight, None, None, None


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
        return _Fp8Matmul.apply(x, None, self.weight_fp8, self.weight_fp8_t, self.scale)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 weight"


@dataclass(frozen=True)
class Fp8Cast:
    """Where an optimizer kernel writes a weight's fp8 copy as it writes the weight.

    The kernel scales by `amax[slot % 3]` (the weight's amax before the step), stores that scale
    in `scale`, gathers the new weight's amax into `amax[(slot + 1) % 3]` (zero before the step)
    and zeroes `amax[(slot + 2) % 3]` for the next step: three slots, so no slot is read and
    written, or zeroed and gathered into, by the same kernel.
    """

    weight_fp8: torch.Tensor
    scale: torch.Tensor
    amax: torch.Tensor
    slot: int


class TrainedFp8Linear(nn.Module):
    """A bias-free linear layer with a trained bf16 weight and its fp8 copy, remade once a step."""

    weight: nn.Parameter
    weight_fp8: torch.Tensor
    scale: torch.Tensor
    amax: torch.Tensor
    casts: int  # fp8 copies made after the first

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if linear.bias is not None or not linear.weight.requires_grad:
            raise ValueError("TrainedFp8Linear takes a trained linear layer without bias")
        self.in_features: int = linear.in_features
        self.out_features: int = linear.out_features
        self.weight = linear.weight
        weight_fp8, scale = _quantise(linear.weight.detach(), E4M3)
        # Not in the state dict: checkpoints hold the bf16 weight only, as nn.Linear's do.
        self.register_buffer("weight_fp8", weight_fp8, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        amax = torch.zeros(3, dtype=torch.float32, device=scale.device)
        amax[0] = linear.weight.detach().abs().amax()
        self.register_buffer("amax", amax, persistent=False)
        self.casts = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Fp8Matmul.apply(x, self.weight, self.weight_fp8, None, self.scale)

    @torch.no_grad()
    def cast(self) -> None:
        """Remake the fp8 copy from the weight's current amax (after an optimizer that does not)."""
        amax = self.weight.detach().abs().amax()
        weight_fp8, scale = _quantise(self.weight.detach(), E4M3, amax)
        self.weight_fp8.copy_(weight_fp8)
        self.scale.copy_(scale)
        self.casts += 1
        self.amax[self.casts % 3] = amax
        self.amax[(self.casts + 1) % 3] = 0.0

    def fused_cast(self) -> Fp8Cast:
        """Hand this step's cast to the optimizer kernel that writes the weight (see Fp8Cast)."""
        self.casts += 1
        return Fp8Cast(self.weight_fp8, self.scale, self.amax, self.casts - 1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 copy of the weight"


def _swap_linears(model: nn.Module, is_target: Callable[[str, nn.Module], bool], make: type[nn.Module]) -> int:
    swapped = 0
    for name, module in list(model.named_modules()):
        if is_target(name, module):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, make(module))
            swapped += 1
    return swapped


def _bias_free_linear(module: nn.Module, trained: bool) -> bool:
    return isinstance(module, nn.Linear) and module.bias is None and module.weight.requires_grad == trained


def freeze_to_fp8(model: nn.Module, is_target: Callable[[str, nn.Module], bool]) -> int:
    """Replace every frozen, bias-free target linear layer (`is_target(name, module)`) in place;
    returns how many."""
    return _swap_linears(model, lambda name, m: is_target(name, m) and _bias_free_linear(m, False), FrozenFp8Linear)


def train_in_fp8(model: nn.Module, is_target: Callable[[str, nn.Module], bool]) -> int:
    """Replace every trained, bias-free target linear layer in place; returns how many. Their fp8
    copies must be remade after each optimizer step (`cast`, or the optimizer's `fused_cast`)."""
    return _swap_linears(model, lambda name, m: is_target(name, m) and _bias_free_linear(m, True), TrainedFp8Linear)
