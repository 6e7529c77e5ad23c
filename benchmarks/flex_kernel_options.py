"""Does another FlexAttention kernel configuration shorten the default rows' attention?

`python benchmarks/flex_kernel_options.py OUT.json` on a GPU: the document-masked attention of one
Llama-2-7B layer (32 heads of 128, seq 4096), forward and backward, over the masks of the first 16
blocks the bench's rows train on (ghsweep.bench.rows.default_blocks), with q, k and v laid out as the
projections hand them over. Each variant is FlexAttention compiled with other `kernel_options` (tile
sizes, warps and stages of the forward and the backward kernels, TMA), or with Inductor's autotuning
of its templates (mode="max-autotune-no-cudagraphs"). The variants are timed in alternation, ROUNDS
times; the table prints last, in ms per layer, against torch's default configuration.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import flex_attention

from ghsweep.bench.rows import compose_ours, default_blocks
from ghsweep.train.packed_attention import document_block_mask, document_ids

HEADS, DIM, SEQ = 32, 128, 4096
# name: (kernel_options, torch.compile mode)
VARIANTS: dict[str, tuple[dict, str]] = {
    "default": ({}, "default"),
    "max_autotune": ({}, "max-autotune-no-cudagraphs"),
    "fwd128x128_w8s2": ({"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2}, "default"),
    "fwd128x64_w4s3": ({"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}, "default"),
    "bwd64x128_128x64_w8s2": (
        {"BLOCK_M1": 64, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 64, "num_warps": 8, "num_stages": 2},
        "default",
    ),
    "bwd32x128_128x32_w4s3": (
        {"BLOCK_M1": 32, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 32, "num_warps": 4, "num_stages": 3},
        "default",
    ),
    "tma": ({"USE_TMA": True}, "default"),
}


def projection_layout(device: torch.device) -> torch.Tensor:
    """A (1, heads, seq, dim) view of a (1, seq, heads * dim) GEMM output, as transformers' Llama passes it."""
    t = torch.randn(1, SEQ, HEADS * DIM, device=device, dtype=torch.bfloat16)
    return t.view(1, SEQ, HEADS, DIM).transpose(1, 2).requires_grad_(True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    positions = default_blocks(compose_ours([], SEQ, 8, 3, 32)).position_ids[:16]
    masks = [document_block_mask(document_ids(p[None]), device) for p in positions]
    q, k, v = (projection_layout(device) for _ in range(3))
    grad = torch.randn(1, HEADS, SEQ, DIM, device=device, dtype=torch.bfloat16)

    steps = {}
    for name, (options, mode) in VARIANTS.items():
        torch._dynamo.reset()
        attend = torch.compile(flex_attention, mode=mode, dynamic=False)

        def step(mask, attend=attend, options=options):
            attend(q, k, v, block_mask=mask, kernel_options=options or None).backward(grad)

        started = time.time()
        step(masks[0])
        torch.cuda.synchronize()
        print(f"{name}: compiled in {time.time() - started:.1f} s", flush=True)
        steps[name] = step

    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            for mask in masks:  # the round's warm-up
                step(mask)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(3):
                for mask in masks:
                    step(mask)
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) / (3 * len(masks)))
    rows = {name: {"median_ms": statistics.median(t), "min": min(t), "max": max(t)} for name, t in times.items()}
    result = {"card": torch.cuda.get_device_name(), "rounds": args.rounds, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    base = rows["default"]["median_ms"]
    print(f"{result['card']}: FlexAttention forward+backward of one layer, seq {SEQ}, document masks of 16 blocks")
    print("variant | ms per layer (median of rounds) | min | max | x32 layers | vs default")
    for name, r in rows.items():
        print(
            f"{name} | {r['median_ms']:.4f} | {r['min']:.4f} | {r['max']:.4f} | "
            f"{32 * r['median_ms']:.2f} | {r['median_ms'] / base:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
