"""Does FlexAttention's speed depend on the memory layout of q, k, v and the output gradient?

`python benchmarks/attention_layout.py OUT.json` on a GPU: the document-masked attention of one
Llama-2-7B layer (32 heads of 128, seq 4096, packed documents of dolly-like lengths), forward and
backward, with its inputs laid out as a model hands them over:
- `bhsd`: contiguous (batch, heads, seq, dim), what a kernel that writes the heads apart leaves;
- `bshd`: a (batch, seq, heads * dim) GEMM output viewed as heads and transposed, as transformers'
  Llama attention passes its projections on.
Each variant is timed in alternation with the others, REPEATS times; the table prints last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

HEADS, DIM = 32, 128


def document_ids(seq: int, generator: torch.Generator) -> torch.Tensor:
    """Document index of each token of a block packed with examples of 64-1,536 tokens."""
    lengths, total = [], 0
    while total < seq:
        n = int(torch.randint(64, 1536, (1,), generator=generator))
        lengths.append(min(n, seq - total))
        total += lengths[-1]
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).unsqueeze(0)


def inputs(layout: str, seq: int, device: torch.device) -> list[torch.Tensor]:
    """q, k, v and the output's gradient in `layout`, each shaped (1, HEADS, seq, DIM)."""
    made = []
    for _ in range(4):
        if layout == "bhsd":
            t = torch.randn(1, HEADS, seq, DIM, device=device, dtype=torch.bfloat16)
        else:
            t = torch.randn(1, seq, HEADS * DIM, device=device, dtype=torch.bfloat16).view(1, seq, HEADS, DIM)
            t = t.transpose(1, 2)
        made.append(t)
    return made


def time_ms(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    docs = document_ids(args.seq, torch.Generator().manual_seed(0)).to(device)

    def same_document_causal(b, h, q, kv):
        return (docs[b, q] == docs[b, kv]) & (q >= kv)

    mask = create_block_mask(same_document_causal, 1, None, args.seq, args.seq, device=device)
    attend = torch.compile(flex_attention)
    variants = {}
    for layout in ("bhsd", "bshd"):
        q, k, v, grad = inputs(layout, args.seq, device)
        for t in (q, k, v):
            t.requires_grad_(True)

        def step(q=q, k=k, v=v, grad=grad):
            out = attend(q, k, v, block_mask=mask)
            out.backward(grad)

        step()  # compile
        variants[layout] = step
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, step in variants.items():
            times[name] += time_ms(step, args.repeats)
    rows = {
        name: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t), "n": len(t)}
        for name, t in times.items()
    }
    result = {
        "card": torch.cuda.get_device_name(),
        "what": f"flex_attention forward+backward, seq {args.seq}, {HEADS} heads of {DIM}, document mask",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{result['card']}: {result['what']}")
    print("layout | median ms | min | max | n")
    for name, r in rows.items():
        print(f"{name} | {r['median_ms']:.3f} | {r['min_ms']:.3f} | {r['max_ms']:.3f} | {r['n']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
