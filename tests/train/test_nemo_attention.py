"""backend=nemo without Transformer Engine: Megatron's core attention on PyTorch's kernels
(ghsweep.train.nemo.torch_core_attention), checked on CPU against plain causal SDPA per document."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.nemo, pytest.mark.usefixtures("nemo_llm")]

HEADS, DIM = 4, 16


def _alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[tokens, heads, dim] of one document -> causal SDPA -> [tokens, heads * dim]."""
    out = F.scaled_dot_product_attention(*(x.transpose(0, 1) for x in (q, k, v)), is_causal=True)
    return out.transpose(0, 1).reshape(q.size(0), -1)


def test_packed_documents_attend_only_within_themselves():
    from ghsweep.train.nemo.torch_core_attention import TorchCoreAttention

    torch.manual_seed(0)
    lengths = [40, 100, 60]
    q, k, v = (torch.randn(sum(lengths), HEADS, DIM) for _ in range(3))
    cu_seqlens = torch.tensor([0, 40, 140, 200], dtype=torch.int32)
    attention = SimpleNamespace(softmax_scale=DIM**-0.5)
    packed = SimpleNamespace(cu_seqlens_q_padded=None, cu_seqlens_q=cu_seqlens)
    with torch.no_grad():  # FlexAttention has a CPU forward, no CPU backward
        out = TorchCoreAttention.forward(attention, q, k, v, None, packed_seq_params=packed)
    expected = torch.cat([_alone(q[a:b], k[a:b], v[a:b]) for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_an_unpacked_batch_is_causal_sdpa():
    from ghsweep.train.nemo.torch_core_attention import TorchCoreAttention

    torch.manual_seed(0)
    q, k, v = (torch.randn(32, 2, HEADS, DIM) for _ in range(3))  # [s, b, heads, dim]
    out = TorchCoreAttention.forward(SimpleNamespace(softmax_scale=DIM**-0.5), q, k, v, None)
    expected = torch.stack([_alone(q[:, b], k[:, b], v[:, b]) for b in range(2)], dim=1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
