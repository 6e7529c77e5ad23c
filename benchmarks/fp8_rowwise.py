"""fp8 GEMMs with one scale per tensor (tensorwise, what precision=fp8 uses with torchao) against one
scale per row (rowwise), on Llama-2-7B's projection shapes at 4096 tokens, with what each costs to make
its operand: an RMSNorm's output quantised (compiled), tensorwise needing the whole tensor's amax before
it can cast, rowwise only its row's.

    python benchmarks/fp8_rowwise.py OUT.json

Prints a table of medians (ms) over ROUNDS alternating rounds, min-max in brackets, last. Needs a GPU of
compute capability >= 8.9.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable

import torch

TOKENS = 4096
# (in, out) of the base GEMMs: q/k/v/o, gate/up, down.
SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]
ROUNDS = 5
CALLS = 20  # per timing, back to back
E4M3 = torch.float8_e4m3fn
MAX = torch.finfo(E4M3).max


def timed_ms(fn: Callable[[], object]) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(CALLS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / CALLS


def quantise(y: torch.Tensor, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    amax = y.abs().amax(dim=-1, keepdim=True) if rowwise else y.abs().amax()
    scale = MAX / amax.float().clamp(min=1e-12)
    return (y.float() * scale).clamp(-MAX, MAX).to(E4M3), scale.reciprocal()


def rms_norm(h: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return (h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(h.dtype) * gain


def norm_then_quantise(h: torch.Tensor, gain: torch.Tensor, rowwise: bool):
    """An RMSNorm's bf16 output (kept: LoRA's adapters read it) and its fp8 copy."""
    y = rms_norm(h, gain)
    return y, *quantise(y, rowwise)


def variants() -> dict[str, Callable[[], object]]:
    out: dict[str, Callable[[], object]] = {}
    for k, n in SHAPES:
        x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x8, w8 = x.to(E4M3), w.to(E4M3)
        one = torch.ones((), device="cuda")
        rows, cols = torch.ones(TOKENS, 1, device="cuda"), torch.ones(1, n, device="cuda")
        out[f"gemm {k}->{n} bf16"] = lambda x=x, w=w: x @ w.t()
        out[f"gemm {k}->{n} fp8 tensorwise"] = lambda x8=x8, w8=w8, one=one: torch._scaled_mm(
            x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
        )
        out[f"gemm {k}->{n} fp8 rowwise"] = lambda x8=x8, w8=w8, rows=rows, cols=cols: torch._scaled_mm(
            x8, w8.t(), scale_a=rows, scale_b=cols, out_dtype=torch.bfloat16, use_fast_accum=True
        )
    for k in (4096, 11008):
        h = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
        gain = torch.randn(k, device="cuda", dtype=torch.bfloat16)
        for rowwise in (False, True):
            fn = torch.compile(lambda h, g, rowwise=rowwise: norm_then_quantise(h, g, rowwise))
            out[f"norm+quantise {k} {'rowwise' if rowwise else 'tensorwise'}"] = lambda fn=fn, h=h, g=gain: fn(h, g)
        norm = torch.compile(rms_norm)
        out[f"norm {k} alone (bf16)"] = lambda norm=norm, h=h, g=gain: norm(h, g)
    return out


def main(out_path: str) -> None:
    cases = variants()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(ROUNDS):
        for name, fn in cases.items():
            times[name].append(timed_ms(fn))
    card = torch.cuda.get_device_name()
    result = {
        "command": f"python benchmarks/fp8_rowwise.py {out_path}",
        "device": card,
        "torch": torch.__version__,
        "ms": {name: {"median": statistics.median(t), "min": min(t), "max": max(t)} for name, t in times.items()},
    }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{card}, torch {torch.__version__}, {TOKENS} tokens; median ms over {ROUNDS} rounds (min-max)")
    for name, t in times.items():
        print(f"{name:<40} {statistics.median(t):8.4f}  ({min(t):.4f}-{max(t):.4f})")


if __name__ == "__main__":
    main(sys.argv[1])
