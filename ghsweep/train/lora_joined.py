"""LoRA layers whose adapter GEMMs are joined to the frozen base layer's (peft.adapter_gemms).

peft computes a LoRA layer as base(x) + B(A(x)) * scaling. Beside the base layer's GEMM, forward's
x @ A.T reads the input x a second time and backward's g @ B reads the output gradient g a second
time: two thin (rank-wide) GEMMs whose cost is a full activation's read, 14 of the 42 adapter GEMMs
of a Llama layer. Here the frozen weight W and the adapters live in one buffer

    joined = [[W, B],      (out + r) x (in + r); r padded to a multiple of 8 (16-byte rows) with zeros
              [A, 0]]

so that forward's x @ joined[:, :in].T is [x W.T, x A.T] and backward's g @ joined[:out] is [g W, g B]:
one GEMM each, each activation read once, the thin outputs riding along as r more columns of the
base GEMM's. The rest is LoRA's arithmetic unchanged: y = x W.T + s (x A.T) B.T, and in backward
dx = g W + s (g B) A, dA = s (g B).T x, dB = s g.T (x A.T).

A and B stay parameters of their own, stepped by the optimizer as peft's are; their values are copied
into the buffer after each optimizer step (`refresh`: 80 MB for all of Llama-2-7B's adapters at r=16).
The base weight lives only in the buffer, so memory stays that of the base model and the adapters.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# bf16/fp16 rows of the buffer stay 16-byte aligned (what cuBLAS's fastest kernels read) when the rank's
# columns are padded to a multiple of 8 elements.
_ALIGN = 8


class _JoinedLoraMatmul(torch.autograd.Function):
    """x @ W.T + scaling * (x @ A.T) @ B.T with W, A and B read from `joined` where the base GEMMs
    take them; `lora_a` and `lora_b` are the trained parameters (the same values) that receive the
    gradients."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        joined: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scaling: float,
    ) -> torch.Tensor:
        rank, in_features = lora_a.shape
        out_features = lora_b.shape[0]
        x2d = x.reshape(-1, in_features)
        base_and_xa = x2d @ joined[:, :in_features].t()  # [x W.T, x A.T]
        xa = base_and_xa[:, out_features : out_features + rank]
        # Scaled after the GEMM, as peft does: Inductor then adds it to the base output inside the consumer's
        # kernel; `base + mm` it would turn into an addmm, which copies the strided base output first.
        y = base_and_xa[:, :out_features] + (xa @ lora_b.t()) * scaling
        ctx.save_for_backward(x2d, xa, joined, lora_a)
        ctx.scaling = scaling
        return y.reshape(*x.shape[:-1], out_features)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, None, torch.Tensor, torch.Tensor, None]:
        x2d, xa, joined, lora_a = ctx.saved_tensors
        rank, in_features = lora_a.shape
        out_features = grad_y.shape[-1]
        g = grad_y.reshape(-1, out_features)
        grad_x = None
        if ctx.needs_input_grad[0]:
            base_and_gb = g @ joined[:out_features]  # [g W, g B]
            gb = base_and_gb[:, in_features : in_features + rank]
            grad_x = base_and_gb[:, :in_features] + (gb @ lora_a) * ctx.scaling
            grad_x = grad_x.reshape(*grad_y.shape[:-1], in_features)
        else:  # the first layer's input: only the adapters' gradients are wanted
            gb = g @ joined[:out_features, in_features : in_features + rank]
        return grad_x, None, (gb.t() @ x2d) * ctx.scaling, (g.t() @ xa) * ctx.scaling, None


class JoinedLoraLinear(nn.Module):
    """A peft LoRA linear layer (one adapter, no dropout, a bias-free base in the adapters' dtype) as
    one buffer holding W, A and B (see the module's docstring)."""

    def __init__(self, peft_layer: Any):
        super().__init__()
        why_not = why_not_joined(peft_layer)
        if why_not:
            raise ValueError(f"cannot join this LoRA layer's GEMMs: {why_not}")
        (adapter,) = peft_layer.active_adapters
        base: nn.Linear = peft_layer.base_layer
        self.lora_A = peft_layer.lora_A[adapter].weight  # (r, in), trained
        self.lora_B = peft_layer.lora_B[adapter].weight  # (out, r), trained
        self.scaling = float(peft_layer.scaling[adapter])
        self.in_features, self.out_features = base.in_features, base.out_features
        rank = self.lora_A.shape[0]
        padded = -(-rank // _ALIGN) * _ALIGN
        weight = base.weight.detach()
        joined = torch.zeros(
            self.out_features + padded, self.in_features + padded, dtype=weight.dtype, device=weight.device
        )
        joined[: self.out_features, : self.in_features] = weight
        self.register_buffer("joined", joined)
        refresh([self])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _JoinedLoraMatmul.apply(x, self.joined, self.lora_A, self.lora_B, self.scaling)

    def adapter_slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffer's views that hold A and B."""
        rank = self.lora_A.shape[0]
        return (
            self.joined[self.out_features : self.out_features + rank, : self.in_features],
            self.joined[: self.out_features, self.in_features : self.in_features + rank],
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, r={self.lora_A.shape[0]}, "
            "adapters joined to the base GEMMs"
        )


@torch.no_grad()
def refresh(layers: list[JoinedLoraLinear]) -> None:
    """Copy each layer's adapters into its buffer (after each optimizer step), in one call for all."""
    if layers:
        slots = [slot for layer in layers for slot in layer.adapter_slots()]
        torch._foreach_copy_(slots, [p for layer in layers for p in (layer.lora_A, layer.lora_B)])


def why_not_joined(peft_layer: Any) -> str | None:
    """Why this layer's adapter GEMMs cannot be joined to its base layer's, or None if they can."""
    base = getattr(peft_layer, "base_layer", None)
    if not isinstance(base, nn.Linear) or type(base) is not nn.Linear:
        return f"its base layer is a {type(base).__name__}, not a plain linear layer (fp8 GEMMs take no bf16 adapter)"
    if base.bias is not None:
        return "its base layer has a bias"
    adapters = list(peft_layer.active_adapters)
    if len(adapters) != 1 or getattr(peft_layer, "merged", False) or peft_layer.lora_variant:
        return "it is not one plain LoRA adapter (several, merged, or a variant such as DoRA)"
    if not isinstance(peft_layer.lora_dropout[adapters[0]], nn.Identity):
        return "peft.dropout > 0 drops the input of A alone, which the base GEMM cannot"
    if peft_layer.lora_A[adapters[0]].weight.dtype != base.weight.dtype:
        return f"its adapters are {peft_layer.lora_A[adapters[0]].weight.dtype}, its base {base.weight.dtype}"
    return None


def join_adapters(model: nn.Module, mode: str) -> list[JoinedLoraLinear]:
    """Replace peft's LoRA linear layers in `model` by joined ones: every one (mode joined: ValueError
    naming the first that cannot be), every one that can be (auto), or none (separate). Returns them."""
    if mode == "separate":
        return []
    from peft.tuners.lora.layer import Linear as PeftLoraLinear

    joined: list[JoinedLoraLinear] = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, PeftLoraLinear):
            continue
        why_not = why_not_joined(module)
        if why_not and mode == "joined":
            raise ValueError(f"peft.adapter_gemms=joined: {name} {why_not}; accepted here: auto, separate")
        if why_not:
            continue
        parent_name, _, child = name.rpartition(".")
        layer = JoinedLoraLinear(module)
        setattr(model.get_submodule(parent_name), child, layer)
        joined.append(layer)
    return joined
