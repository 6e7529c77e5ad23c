"""LoRA B's two gradients at Llama-2-7B's shapes (4096 tokens, rank 16): cuBLAS's two GEMMs, as the
compiled layers run them, against one Triton kernel that reads the output's gradient once
(ghsweep/train/lora_b_grads.py), with each tiling given below.

    python benchmarks/lora_b_grads.py OUT.json

Checks each result against fp32, then prints a table of medians (ms) over ROUNDS alternating rounds,
min-max in brackets, last; each case replayed as a CUDA graph, so that the GPU's time is measured
and not the launches'. Needs a CUDA GPU.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable

import torch

from ghsweep.bench.optimizer_step import mean_ms
from ghsweep.train.lora_b_grads import Tiles, lora_b_grads

TOKENS, RANK, SCALE = 4096, 16, 2.0
OUT_FEATURES = [4096, 11008]
TILINGS = [
    Tiles(),
    Tiles(rows=128, columns=64, column_splits=8, warps=4, stages=3),
    Tiles(rows=256, columns=128, column_splits=4, warps=8, stages=2),
    Tiles(rows=512, columns=32, column_splits=8, warps=8, stages=3),
    Tiles(rows=256, columns=64, column_splits=16, warps=8, stages=4),
]
ROUNDS = 5
CALLS = 20


def tiling_name(tiles: Tiles) -> str:
    return f"{tiles.rows}x{tiles.columns}/{tiles.column_splits} w{tiles.warps} s{tiles.stages}"


def cases_for(columns: int, device: torch.device) -> tuple[dict[str, Callable[[], tuple]], tuple]:
    """Each way to compute B's two gradients for `columns` output features, and the fp32 result."""
    g = torch.randn(TOKENS, columns, device=device, dtype=torch.bfloat16)
    t = torch.randn(TOKENS, RANK, device=device, dtype=torch.bfloat16)
    b = torch.randn(columns, RANK, device=device, dtype=torch.bfloat16) * 0.02
    exact = ((g.float() @ b.float()) * SCALE, (g.float().t() @ t.float()) * SCALE)
    cases: dict[str, Callable[[], tuple]] = {
        f"{columns} cuBLAS, two GEMMs": lambda: (torch.mm(g, b) * SCALE, torch.mm(g.t(), t) * SCALE)
    }
    for tiles in TILINGS:
        cases[f"{columns} one kernel {tiling_name(tiles)}"] = lambda tiles=tiles: lora_b_grads(g, t, b, SCALE, tiles)
    return {name: graphed(case) for name, case in cases.items()}, exact


def graphed(case: Callable[[], tuple]) -> Callable[[], tuple]:
    """`case` replayed as a CUDA graph: the GPU's time, without the launches' (which the compiled
    training step overlaps with the GPU's work), returning the outputs of the capture."""
    case()  # Triton compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = case()

    def replay() -> tuple:
        graph.replay()
        return outputs

    return replay


def main(out: str) -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    timings: dict[str, list[float]] = {}
    errors: dict[str, float] = {}
    for columns in OUT_FEATURES:
        cases, exact = cases_for(columns, device)
        for name, case in cases.items():
            got = case()
            errors[name] = max(float((x.float() - e).norm() / e.norm()) for x, e in zip(got, exact))
        for _ in range(ROUNDS):
            for name, case in cases.items():
                timings.setdefault(name, []).append(mean_ms(case, device, warmup=3, steps=CALLS))
    rows = {
        name: {"median": statistics.median(ms), "min": min(ms), "max": max(ms), "relative_error": errors[name]}
        for name, ms in timings.items()
    }
    record = {"command": "python benchmarks/lora_b_grads.py OUT.json", "device": torch.cuda.get_device_name()}
    with open(out, "w") as f:
        json.dump({**record, "torch": torch.__version__, "ms": rows}, f, indent=1)
    print(f"{'case':<60} {'ms':>8} {'min-max':>16} {'rel. error':>10}")
    for name, r in rows.items():
        print(f"{name:<60} {r['median']:8.4f} {r['min']:7.4f}-{r['max']:.4f} {r['relative_error']:10.2e}")


if __name__ == "__main__":
    main(sys.argv[1])
