"""Fused projections: one GEMM for q, k and v and one for gate and up, which read the same input.

Each group's weights are concatenated into one (sum of outputs x hidden) linear layer; with LoRA
the groups' A matrices are concatenated too (one small GEMM reads the input once instead of three
times), and each projection keeps its own B matrix. The maths is the same as the separate layers'
(the fused weight's rows are theirs, each A row block gets the gradient its own layer would get),
so a fused run follows an unfused one to rounding. LoRA dropout draws one mask per layer input, so
with `peft.dropout` > 0 projections are not fused (train.fuse_projections=auto).

Only the attention and MLP forwards change (`FusedLlamaAttention`, `FusedLlamaMLP`: the library's
forwards with the fused calls); the layers keep their other modules and attributes.
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn
from transformers.models.llama import modeling_llama


class FusedProjection(nn.Module):
    """Linear layers (plain, or peft LoRA layers of one rank and scaling) that read the same input, as one."""

    def __init__(self, projections: list[nn.Module]):
        super().__init__()
        bases = [getattr(p, "base_layer", p) for p in projections]
        if any(b.bias is not None for b in bases):
            raise ValueError("FusedProjection takes linear layers without bias")
        self.out_features = [b.out_features for b in bases]
        weight = torch.cat([b.weight.detach() for b in bases])
        self.base = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
        self.base.weight = nn.Parameter(weight, requires_grad=bases[0].weight.requires_grad)
        self.lora_A: nn.Linear | None = None
        if hasattr(projections[0], "base_layer"):
            a_layers = [p.lora_A["default"] for p in projections]
            a_weight = torch.cat([a.weight.detach() for a in a_layers])
            self.lora_A = nn.Linear(a_weight.shape[1], a_weight.shape[0], bias=False, device=a_weight.device,
                                    dtype=a_weight.dtype)
            self.lora_A.weight = nn.Parameter(a_weight)
            self.ranks = [a.out_features for a in a_layers]
            self.lora_B = nn.ModuleList(p.lora_B["default"] for p in projections)
            self.scaling = projections[0].scaling["default"]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.base(x)
        if self.lora_A is not None:
            a = self.lora_A(x).split(self.ranks, -1)
            y = y + torch.cat([b(part) for b, part in zip(self.lora_B, a)], -1) * self.scaling
        return y.split(self.out_features, -1)


class FusedLlamaAttention(modeling_llama.LlamaAttention):
    """LlamaAttention with q, k and v from one `qkv_proj`; training only (no KV cache)."""

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: Any = None, past_key_values: Any = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        if past_key_values is not None:
            raise ValueError("fused projections are for training: call the decoder with use_cache=False")
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query, key, value = (t.view(hidden_shape).transpose(1, 2) for t in self.qkv_proj(hidden_states))
        cos, sin = position_embeddings
        query, key = modeling_llama.apply_rotary_pos_emb(query, key, cos, sin)
        attention = modeling_llama.ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        out, weights = attention(self, query, key, value, attention_mask,
                                 dropout=0.0 if not self.training else self.attention_dropout,
                                 scaling=self.scaling, **kwargs)
        return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


class FusedLlamaMLP(modeling_llama.LlamaMLP):
    """LlamaMLP with gate and up from one `gate_up_proj`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x)
        return self.down_proj(self.act_fn(gate) * up)


def _fusable(projections: list[nn.Module]) -> bool:
    """All plain linear layers, or all LoRA layers of one rank and scaling."""
    lora = [hasattr(p, "base_layer") for p in projections]
    if not all(lora):
        return not any(lora) and all(type(p) is nn.Linear for p in projections)
    return (len({p.lora_A["default"].out_features for p in projections}) == 1
            and len({p.scaling["default"] for p in projections}) == 1)


def fuse_enabled(train: DictConfig, peft: DictConfig) -> bool:
    """train.fuse_projections: true, false, or auto (fused unless LoRA dropout draws masks per projection)."""
    if train.fuse_projections == "auto":
        return peft.name == "none" or peft.dropout == 0
    return bool(train.fuse_projections)


def fuse_projections(layers: nn.ModuleList) -> int:
    """Fuse q/k/v and gate/up in every Llama decoder layer where they are fusable; returns how many
    groups were fused. Call after peft and before fp8 (fp8 then converts the fused layers)."""
    fused = 0
    for layer in layers:
        attention, mlp = layer.self_attn, layer.mlp
        qkv = [attention.q_proj, attention.k_proj, attention.v_proj]
        if type(attention) is modeling_llama.LlamaAttention and _fusable(qkv):
            attention.qkv_proj = FusedProjection(qkv)
            del attention.q_proj, attention.k_proj, attention.v_proj
            attention.__class__ = FusedLlamaAttention
            fused += 1
        gate_up = [mlp.gate_proj, mlp.up_proj]
        if type(mlp) is modeling_llama.LlamaMLP and _fusable(gate_up):
            mlp.gate_up_proj = FusedProjection(gate_up)
            del mlp.gate_proj, mlp.up_proj
            mlp.__class__ = FusedLlamaMLP
            fused += 1
    return fused
