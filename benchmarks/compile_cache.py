"""Which of torch.compile's caches lets a fresh process skip the compile another process did:
`python benchmarks/compile_cache.py [--json OUT.json]`.

A tiny decoder-like block (linear, GELU, linear, residual, layer norm; forward and backward) is
compiled in fresh interpreters, per mechanism and repeat one with an empty cache (cold) and then one
on what it left (warm):
- dir: a shared TORCHINDUCTOR_CACHE_DIR (Inductor's FX graph cache, AOTAutograd's cache, Triton's);
- mega: each process its own empty TORCHINDUCTOR_CACHE_DIR, with torch.compiler.save_cache_artifacts()
  written to a file after a compile and load_cache_artifacts() read before the next (the portable
  "mega-cache").
Measured on a shared 2-core CPU, torch 2.13 (one repeat; load average 12): dir cold 37.2 s, warm 5.0 s
(2 FX graph hits, 0 misses); mega cold 88.4 s, warm 49.8 s (2 hits): the shared folder is what a
worker uses (ghsweep/train/compile_cache.py).
Each row: the compile time (the first step less a steady step) and the cache counters torch counts
(torch._dynamo.utils.counters: inductor fxgraph_cache_hit/miss, aot_autograd autograd_cache_hit/miss).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
import torch
from torch._dynamo.utils import counters
mega = sys.argv[1] if len(sys.argv) > 1 else ""
if mega and os.path.exists(mega):
    torch.compiler.load_cache_artifacts(open(mega, "rb").read())
torch.manual_seed(0)
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down, self.norm = torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256), torch.nn.LayerNorm(256)
    def forward(self, x):
        return self.norm(self.down(torch.nn.functional.gelu(self.up(x))) + x)
block = Block()
block.compile()
x = torch.randn(64, 256)
def step():
    started = time.perf_counter()
    block(x).square().mean().backward()
    return time.perf_counter() - started
first = step()
steady = min(step() for _ in range(3))
if mega:
    artifacts = torch.compiler.save_cache_artifacts()
    if artifacts is not None:
        open(mega, "wb").write(artifacts[0])
caches = {k: dict(v) for k, v in counters.items() if k in ("inductor", "aot_autograd")}
print(json.dumps({"compile_s": first - steady, "counters": caches}))
"""


def run(cache_dir: Path, mega: Path | None) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir))
    env.pop("TRITON_CACHE_DIR", None)
    started = time.time()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(mega or "")], env=env, capture_output=True, text=True, check=True
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    counts = row.pop("counters")
    hits = counts.get("inductor", {}).get("fxgraph_cache_hit", 0)
    misses = counts.get("inductor", {}).get("fxgraph_cache_miss", 0)
    aot_hits = counts.get("aot_autograd", {}).get("autograd_cache_hit", 0)
    return row | {"process_s": time.time() - started, "fx_hits": hits, "fx_misses": misses, "aot_hits": aot_hits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    import torch

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mechanism in ("dir", "mega"):
                root = Path(tmp) / f"{mechanism}{repeat}"
                mega = root / "mega.bin" if mechanism == "mega" else None
                for state in ("cold", "warm"):
                    # mega: every process its own Inductor folder, only the artifacts file passes on.
                    cache = root / (state if mega else "shared")
                    rows.append({"mechanism": mechanism, "state": state} | run(cache, mega))
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    print("mechanism | state | compile_s | process_s | fxgraph hits | fxgraph misses | autograd hits")
    print("--- | --- | --- | --- | --- | --- | ---")
    for r in rows:
        print(
            f"{r['mechanism']} | {r['state']} | {r['compile_s']:.2f} | {r['process_s']:.1f} | "
            f"{r['fx_hits']} | {r['fx_misses']} | {r['aot_hits']}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
