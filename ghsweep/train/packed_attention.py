"""How a packed batch's attention is computed: which kernel, and how document boundaries reach it.

Packed blocks hold several examples back to back; `data.packing_mask=document` lets each token
attend only to earlier tokens of its own example (as NeMo's packed SFT), `causal` to every earlier
token of the block (as plain transformers training over a packed block).

| train.attention | document masking | causal block |
|---|---|---|
| auto | flex on a GPU; dense on CPU (FlexAttention has no CPU backward) | SDPA, PyTorch's kernel choice |
| flex | FlexAttention with a block mask: blocks of 128 x 128 tokens that cross documents are skipped | - |
| cudnn, flash, efficient, math | SDPA with a dense (S x S) document mask, that SDPA kernel | SDPA, that kernel |

The block mask is built once per step from the batch's position ids (each example restarts at 0)
and handed to every layer; no S x S mask is materialised on the GPU's default path.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

SDPA_BACKENDS = {
    "cudnn": "CUDNN_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}


def resolve(attention: str, packing_mask: str, device_type: str) -> str:
    """The implementation a run uses: 'flex', 'sdpa' (PyTorch's choice), or an SDPA kernel name."""
    if attention != "auto":
        return attention
    if packing_mask == "document" and device_type == "cuda":
        return "flex"
    return "sdpa"


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Index of the example each token belongs to: a new example starts where its position is 0."""
    return (position_ids == 0).cumsum(-1) - 1


# FlexAttention's tile: the block mask says, per tile of this many queries and keys, whether it is
# skipped, computed with the mask function (partial), or computed whole (full).
BLOCK = 128


def document_block_mask(docs: torch.Tensor) -> Any:
    """FlexAttention's BlockMask for causal attention within each document (`docs[b, t]`: the
    document of token t in row b, never decreasing along a row, as packing leaves them).

    Built from each tile's first and last document, not by evaluating the mask function over every
    (query, key) pair: a handful of small tensor ops, with nothing to compile (torch.compile of
    create_block_mask cost each worker 2-3 s at start, even with its graph cached) and no S x S
    intermediate. A tile below the diagonal whose queries and keys share one document is full; one
    whose document ranges meet is partial (the mask function decides its pairs); the rest are skipped.
    """
    from torch.nn.attention.flex_attention import BlockMask

    batch_size, seq = docs.shape
    starts = torch.arange(0, seq, BLOCK, device=docs.device)
    # Documents never decrease along a row, so a tile's first and last token bound the documents it holds.
    first, last = docs[:, starts], docs[:, torch.clamp(starts + BLOCK, max=seq) - 1]
    q_first, q_last = first[:, :, None], last[:, :, None]  # (batch, query tile, 1)
    kv_first, kv_last = first[:, None, :], last[:, None, :]  # (batch, 1, key tile)
    tiles = len(starts)
    causal = torch.ones(tiles, tiles, dtype=torch.bool, device=docs.device).tril()
    diagonal = torch.eye(tiles, dtype=torch.bool, device=docs.device)
    meet = causal & (q_first <= kv_last) & (kv_first <= q_last)
    # A tile that runs past seq (the last, when seq is not a multiple of BLOCK) is never full.
    whole = starts + BLOCK <= seq
    one_document = (q_first == q_last) & (kv_first == kv_last) & (q_first == kv_first)
    full = meet & one_document & ~diagonal & whole[:, None] & whole[None, :]
    partial = meet & ~full

    def kv_blocks(tile_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Per query tile: how many key tiles, and their indices first (ascending), as create_block_mask.
        counts = tile_mask.sum(-1, dtype=torch.int32)
        order = torch.argsort(tile_mask.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return counts[:, None], order[:, None]

    def same_document_causal(b, h, q, kv):
        return (docs[b, q] == docs[b, kv]) & (q >= kv)

    return BlockMask.from_kv_blocks(
        *kv_blocks(partial), *kv_blocks(full), BLOCK_SIZE=BLOCK, mask_mod=same_document_causal, seq_lengths=(seq, seq)
    )


class PackedAttention:
    """Per-step keyword arguments for the decoder, and the region its forward runs in."""

    def __init__(self, implementation: str, packing_mask: str):
        self.implementation = implementation
        self.document = packing_mask == "document"

    @property
    def hf_implementation(self) -> str:
        """transformers' attn_implementation for the model."""
        return "flex_attention" if self.implementation == "flex" else "sdpa"

    def decoder_kwargs(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """What the decoder's forward gets besides input_ids: positions, and the document mask."""
        if not self.document:
            return {}
        positions = batch["position_ids"]
        if self.implementation != "flex":
            # transformers builds the dense block-diagonal mask from the restarting position ids.
            return {"position_ids": positions}
        return {"position_ids": positions, "attention_mask": document_block_mask(document_ids(positions))}

    def region(self) -> contextlib.AbstractContextManager:
        """A fresh context per step that pins SDPA to the chosen kernel (none for flex or auto)."""
        if self.implementation not in SDPA_BACKENDS:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[self.implementation])])


def attended_keys_per_token(position_ids: torch.Tensor, document: bool) -> float:
    """Keys each query token is counted against for attention FLOPs, averaged over the blocks.

    Counted without causal halving (as MFU is usually reported): the whole block for causal
    masking, only the token's own example for document masking (sum of squared example lengths
    over the block length), i.e. the blocks a document-masked kernel really computes.
    """
    seq = position_ids.shape[-1]
    if not document:
        return float(seq)
    rows = document_ids(position_ids).reshape(-1, seq)
    squared = sum(float((torch.bincount(row).double() ** 2).sum()) for row in rows)
    return squared / rows.numel()
