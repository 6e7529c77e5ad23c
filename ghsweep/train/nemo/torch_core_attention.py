"""Megatron's core attention on PyTorch's own kernels, for NeMo runs without Transformer Engine.

Megatron's local layer spec (the one NeMo picks when Transformer Engine is missing) computes
attention as explicit matmuls over a materialised S x S score matrix and refuses packed sequences.
This core attention takes its place in that spec: SDPA with a causal mask for unpacked batches, and
for packed ones (Megatron's THD layout: all documents of the pack back to back, their boundaries in
`cu_seqlens`) FlexAttention with a document block mask, the torch backend's kernel for the same job.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention

from ghsweep.train.packed_attention import document_block_mask

_flex_attention: Any = None
# One block mask per pack: every layer of a step attends over the same documents.
_mask_cache: dict[int, tuple[torch.Tensor, Any]] = {}


def _pack_block_mask(cu_seqlens: torch.Tensor, tokens: int) -> Any:
    key = id(cu_seqlens)
    cached = _mask_cache.get(key)
    if cached is not None and cached[0] is cu_seqlens:
        return cached[1]
    positions = torch.arange(tokens, device=cu_seqlens.device)
    docs = torch.searchsorted(cu_seqlens[1:].to(positions.dtype), positions, right=True)
    mask = document_block_mask(docs.unsqueeze(0))
    _mask_cache.clear()
    _mask_cache[key] = (cu_seqlens, mask)
    return mask


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any, scale: float) -> torch.Tensor:
    global _flex_attention
    if _flex_attention is None:
        from torch.nn.attention.flex_attention import flex_attention

        _flex_attention = torch.compile(flex_attention)
    return _flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.size(1) != k.size(1))


class TorchCoreAttention(DotProductAttention):
    """Megatron's DotProductAttention interface, computed by SDPA (causal) or FlexAttention (packed)."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Any,
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if attention_bias is not None:
            raise ValueError("TorchCoreAttention: attention_bias is not supported; accepted: None")
        if packed_seq_params is None:
            # [s, b, heads, dim] -> [b, heads, s, dim]
            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=q.size(1) != k.size(1)
            )
            # -> [s, b, heads * dim]
            return out.permute(2, 0, 1, 3).reshape(out.size(2), out.size(0), -1)
        # THD: [tokens, heads, dim] -> [1, heads, tokens, dim]
        q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (query, key, value))
        tokens = q.size(2)
        cu_seqlens = packed_seq_params.cu_seqlens_q_padded
        if cu_seqlens is None:
            cu_seqlens = packed_seq_params.cu_seqlens_q
        out = _flex(q, k, v, _pack_block_mask(cu_seqlens, tokens), self.softmax_scale)
        # -> [tokens, heads * dim]; Megatron's attention adds the batch dimension back.
        return out.squeeze(0).transpose(0, 1).reshape(tokens, -1)


def local_layer_spec(config: Any) -> Any:
    """Megatron's local (no Transformer Engine) GPT layer with TorchCoreAttention as its core attention."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts,
        moe_grouped_gemm=config.moe_grouped_gemm,
        qk_layernorm=config.qk_layernorm,
        normalization=config.normalization,
    )
    spec.submodules.self_attention.submodules.core_attention = TorchCoreAttention
    return spec
