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


def document_block_mask(docs: torch.Tensor, device: torch.device | None = None) -> Any:
    """FlexAttention's BlockMask for causal attention within each document (`docs[b, t]`: the
    document of token t in row b, never decreasing along a row, as packing leaves them), on `device`
    (default: where `docs` are).

    Built from each tile's first and last document, not by evaluating the mask function over every
    (query, key) pair: a handful of small tensor ops, with nothing to compile (torch.compile of
    create_block_mask cost each worker 2-3 s at start, even with its graph cached) and no S x S
    intermediate. A tile below the diagonal whose queries and keys share one document is full; one
    whose document ranges meet is partial (the mask function decides its pairs); the rest are skipped.

    With `docs` on the host and `device` a GPU, the mask is built on the host and reaches the GPU in one
    copy that does not wait for the GPU. The host spends 0.5 ms a mask that way, against 1.6 ms for the
    same ops on the GPU with BlockMask.from_kv_blocks transposing under vmap (4,096 tokens, one H200's
    host): time the training loop's host no longer takes from a small model's step.
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

    def ordered(tile_mask: torch.Tensor) -> list[torch.Tensor]:
        # Per row of tiles: how many tiles, and their indices first (ascending), as create_block_mask.
        counts = tile_mask.sum(-1, dtype=torch.int32)
        order = torch.argsort(tile_mask.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return [counts[:, None], order[:, None]]

    # Key tiles per query tile (forward), then query tiles per key tile (backward): the transposed masks.
    parts = [docs, *ordered(partial), *ordered(full), *ordered(partial.mT), *ordered(full.mT)]
    docs, kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx = _moved(
        parts, device or docs.device
    )

    def same_document_causal(b, h, q, kv):
        return (docs[b, q] == docs[b, kv]) & (q >= kv)

    return BlockMask(
        seq_lengths=(seq, seq),
        kv_num_blocks=kv_num,
        kv_indices=kv_idx,
        full_kv_num_blocks=full_kv_num,
        full_kv_indices=full_kv_idx,
        q_num_blocks=q_num,
        q_indices=q_idx,
        full_q_num_blocks=full_q_num,
        full_q_indices=full_q_idx,
        BLOCK_SIZE=(BLOCK, BLOCK),
        mask_mod=same_document_causal,
    )


def _moved(parts: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """`parts` (int32, or document ids that fit it) on `device`: from the host to a GPU as one pinned
    buffer copied without a wait, so the host goes on queueing the step while the copy runs."""
    if device.type != "cuda" or parts[0].is_cuda:
        return [p.to(device) for p in parts]
    flat = torch.cat([p.reshape(-1).to(torch.int32) for p in parts]).pin_memory().to(device, non_blocking=True)
    return [chunk.view(p.shape) for chunk, p in zip(flat.split([p.numel() for p in parts]), parts, strict=True)]


class PackedAttention:
    """Per-step keyword arguments for the decoder, and the region its forward runs in."""

    def __init__(self, implementation: str, packing_mask: str):
        self.implementation = implementation
        self.document = packing_mask == "document"

    @property
    def hf_implementation(self) -> str:
        """transformers' attn_implementation for the model."""
        return "flex_attention" if self.implementation == "flex" else "sdpa"

    def decoder_kwargs(self, positions: torch.Tensor, host_positions: torch.Tensor | None = None) -> dict[str, Any]:
        """What the decoder's forward gets besides input_ids: the batch's positions (on the device), and
        the document mask, built from `host_positions` (the same positions on the host) where given."""
        if not self.document:
            return {}
        if self.implementation != "flex":
            # transformers builds the dense block-diagonal mask from the restarting position ids.
            return {"position_ids": positions}
        docs = document_ids(positions if host_positions is None else host_positions)
        return {"position_ids": positions, "attention_mask": document_block_mask(docs, positions.device)}

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
