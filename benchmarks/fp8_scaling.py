"""What fp8's scaling costs beside the GEMMs, on Llama-2-7B's shapes at 4096 tokens.

- The projection GEMMs in bf16 and in fp8 with one scale per tensor (tensorwise) or per row (rowwise).
- The kernels that make a GEMM's fp8 operand, compiled as the training step compiles them: an activation's
  producer (an RMSNorm; SiLU(gate) * up, the down projection's input) alone, then followed by each way
  to quantise its output: tensorwise from the tensor's own amax (current scaling: the whole tensor's
  amax must be known before the cast, a second pass), rowwise (each row's own amax), and tensorwise from
  the amax of the step before (delayed scaling: the cast and this tensor's amax for the next step can
  share the producer's pass).

    python benchmarks/fp8_scaling.py OUT.json

Prints a table of medians (ms) over ROUNDS alternating rounds, min-max in brackets, last. Needs a GPU of
compute capability >= 8.9.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ghsweep.bench.optimizer_step import mean_ms

TOKENS = 4096
# (in, out) of the base GEMMs: q/k/v/o, gate/up, down.
SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]
ROUNDS = 5
CALLS = 20  # per timing, back to back
E4M3 = torch.float8_e4m3fn
MAX = torch.finfo(E4M3).max


def rms_norm(h: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return (h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(h.dtype) * gain


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


# current: the tensor's own amax; rowwise: each row's; delayed: the step before's, this tensor's amax
# returned for the next. "by rows": the amax taken over each row first, then over the rows, so that the
# row's part can share a kernel that already reduces each row (the norm's).
SCALINGS = ("current", "current by rows", "rowwise", "delayed", "delayed by rows")


def amax_of(y: torch.Tensor, by_rows: bool) -> torch.Tensor:
    return y.abs().amax(dim=-1).amax() if by_rows else y.abs().amax()


def quantised(y: torch.Tensor, scaling: str, previous_amax: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """y (kept: LoRA's adapters read it), its fp8 copy and the scale; delayed also returns y's amax."""
    by_rows = scaling.endswith("by rows")
    if scaling.startswith("delayed"):
        scale = MAX / previous_amax.clamp(min=1e-12)
        return y, (y.float() * scale).clamp(-MAX, MAX).to(E4M3), scale.reciprocal(), amax_of(y, by_rows)
    amax = y.abs().amax(dim=-1, keepdim=True) if scaling == "rowwise" else amax_of(y, by_rows)
    scale = MAX / amax.float().clamp(min=1e-12)
    return y, (y.float() * scale).clamp(-MAX, MAX).to(E4M3), scale.reciprocal()


def gemm_variants() -> dict[str, Callable[[], object]]:
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
    return out


def producer_variants() -> dict[str, Callable[[], object]]:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    previous_amax = torch.tensor(4.0, device="cuda")
    producers: dict[str, tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]] = {
        "norm 4096": (rms_norm, (randn(TOKENS, 4096), randn(4096))),
        "norm 11008": (rms_norm, (randn(TOKENS, 11008), randn(11008))),
        "silu*mul 11008": (silu_mul, (randn(TOKENS, 11008), randn(TOKENS, 11008))),
    }
    out: dict[str, Callable[[], object]] = {}
    for name, (produce, inputs) in producers.items():
        alone = torch.compile(produce)
        out[f"{name} alone (bf16)"] = lambda fn=alone, inputs=inputs: fn(*inputs)
        for scaling in SCALINGS:
            fn = torch.compile(lambda *a, make=produce, scaling=scaling: quantised(make(*a), scaling, previous_amax))
            out[f"{name} + quantise {scaling}"] = lambda fn=fn, inputs=inputs: fn(*inputs)
    return out


def main(out_path: str) -> None:
    # One compiled function per producer and scaling: more than dynamo keeps for one code object by default.
    torch._dynamo.config.recompile_limit = 64
    cases = {**gemm_variants(), **producer_variants()}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(ROUNDS):
        for name, fn in cases.items():
            times[name].append(mean_ms(fn, torch.device("cuda"), warmup=1, steps=CALLS))
    card = torch.cuda.get_device_name()
    result = {
        "command": f"python benchmarks/fp8_scaling.py {out_path}",
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
