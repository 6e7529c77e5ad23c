"""Both gradients of a LoRA B GEMM from one read of its output's gradient: a Triton kernel.

For out = (T @ B.T) * scale (T: the tokens' r-wide outputs of A; B: out_features x r), backward needs
grad_T = scale * g @ B and grad_B = scale * g.T @ T. Each reads all of g (tokens x out_features: 32 MiB
for q at 4096 tokens of Llama-2-7B, 86 MiB for gate) to write r columns, so each is bound by that read;
cuBLAS runs them as two split-K GEMMs and their reduces. Here each program reads its tile of g once and
takes both products from it: grad_T's rows over its columns, grad_B's columns over its rows. Every
partial sum has one writer and the partials are summed in a fixed order, so the result is the same
from run to run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class Tiles:
    """How the kernel cuts g: `rows` x `columns` read per step, the columns shared out among
    `column_splits` programs per block of rows; Triton's warps and pipeline stages."""

    rows: int = 256
    columns: int = 64
    column_splits: int = 8
    warps: int = 8
    stages: int = 3


@triton.jit
def _grads_kernel(
    g,
    t,
    b,
    grad_t_parts,
    grad_b_parts,
    rows_total,
    columns_total,
    columns_per_program,
    g_row_stride,
    RANK: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLUMNS: tl.constexpr,
):
    row_block = tl.program_id(0)
    column_split = tl.program_id(1)
    rows = row_block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    ranks = tl.arange(0, RANK)
    row_ok = rows < rows_total
    t_tile = tl.load(t + rows[:, None] * RANK + ranks[None, :], mask=row_ok[:, None], other=0.0)
    grad_t = tl.zeros((BLOCK_ROWS, RANK), dtype=tl.float32)
    first = column_split * columns_per_program
    for start in range(first, first + columns_per_program, BLOCK_COLUMNS):
        columns = start + tl.arange(0, BLOCK_COLUMNS)
        column_ok = columns < columns_total
        g_tile = tl.load(
            g + rows[:, None] * g_row_stride + columns[None, :], mask=row_ok[:, None] & column_ok[None, :], other=0.0
        )
        b_tile = tl.load(b + columns[:, None] * RANK + ranks[None, :], mask=column_ok[:, None], other=0.0)
        grad_t += tl.dot(g_tile, b_tile)
        grad_b = tl.dot(tl.trans(g_tile), t_tile)
        part = grad_b_parts + row_block * columns_total * RANK
        tl.store(part + columns[:, None] * RANK + ranks[None, :], grad_b, mask=column_ok[:, None])
    part = grad_t_parts + column_split * rows_total * RANK
    tl.store(part + rows[:, None] * RANK + ranks[None, :], grad_t, mask=row_ok[:, None])


def lora_b_grads(
    g: torch.Tensor, t: torch.Tensor, b: torch.Tensor, scale: float, tiles: Tiles = Tiles()
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale * g @ b, scale * g.T @ t) for g (rows x out), t (rows x r), b (out x r), on a CUDA device;
    r a power of two >= 16 (tl.dot's smallest)."""
    rows, columns = g.shape
    rank = t.shape[1]
    g, t, b = g if g.stride(1) == 1 else g.contiguous(), t.contiguous(), b.contiguous()
    row_blocks = triton.cdiv(rows, tiles.rows)
    columns_per_program = triton.cdiv(triton.cdiv(columns, tiles.column_splits), tiles.columns) * tiles.columns
    column_splits = triton.cdiv(columns, columns_per_program)
    grad_t_parts = torch.empty(column_splits, rows, rank, device=g.device, dtype=torch.float32)
    grad_b_parts = torch.empty(row_blocks, columns, rank, device=g.device, dtype=torch.float32)
    _grads_kernel[(row_blocks, column_splits)](
        g,
        t,
        b,
        grad_t_parts,
        grad_b_parts,
        rows,
        columns,
        columns_per_program,
        g.stride(0),
        RANK=rank,
        BLOCK_ROWS=tiles.rows,
        BLOCK_COLUMNS=tiles.columns,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    grad_t = grad_t_parts.sum(0).mul_(scale).to(g.dtype)
    grad_b = grad_b_parts.sum(0).mul_(scale).to(b.dtype)
    return grad_t, grad_b
