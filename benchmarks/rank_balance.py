"""How far a step's costliest rank is above the mean in attention work, with the blocks drawn as
DistributedSampler draws them and as dataloader.balance_ranks deals them (ghsweep/train/rank_balance.py).
The 7B line's data (model=llama2_7b train.seq_length=4096, micro-batch 1): no model, no GPU. Prints a table
last and writes OUT/rank_balance.json when OUT is set; run from the repository root:

    python3 benchmarks/rank_balance.py

A block's work is the FlexAttention tiles its document mask computes (packed_attention.computed_tiles);
each cell is the mean over 50 rounds of the data (epochs, each its own shuffle) and every step in them.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from hydra import compose, initialize_config_dir
from torch.utils.data import DistributedSampler

from ghsweep.config.validate import validate
from ghsweep.train import dolly_data as dolly
from ghsweep.train.packed_attention import computed_tiles
from ghsweep.train.rank_balance import BalancedDistributedSampler
from ghsweep.train.tokenizer import load_tokenizer

OVERRIDES = ("model=llama2_7b", "train.seq_length=4096", "train.micro_batch_size=1")
ROUNDS = 50
WINDOWS = (4, 8, 16)


def excess_pct(samplers: list[DistributedSampler], costs: list[float], batch_size: int) -> float:
    """Mean over steps of (the costliest rank's work - the ranks' mean) / one block's mean work, in %."""
    excess = []
    for epoch in range(ROUNDS):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        per_rank = [list(sampler) for sampler in samplers]
        for start in range(0, len(per_rank[0]) - batch_size + 1, batch_size):
            work = [sum(costs[i] for i in blocks[start : start + batch_size]) for blocks in per_rank]
            excess.append(max(work) - statistics.fmean(work))
    return 100 * statistics.fmean(excess) / (statistics.fmean(costs) * batch_size)


def main() -> None:
    with initialize_config_dir(config_dir=str(Path("conf").resolve()), version_base="1.3"):
        config = validate(compose("config", overrides=list(OVERRIDES)), None)
    dataset = dolly.load_dataset(config, load_tokenizer(config))
    costs = computed_tiles(dataset.position_ids()).tolist()
    batch = config.train.micro_batch_size
    rows = []
    for ranks in (2, 4, 8):
        row = {
            "ranks": ranks,
            "random": excess_pct(
                [DistributedSampler(dataset, ranks, r, shuffle=True, seed=0, drop_last=True) for r in range(ranks)],
                costs,
                batch,
            ),
        }
        for window in WINDOWS:
            samplers = [
                BalancedDistributedSampler(dataset, costs, ranks, r, 0, batch, window_steps=window)
                for r in range(ranks)
            ]
            row[f"window_{window}"] = excess_pct(samplers, costs, batch)
        rows.append(row)
    result = {
        "command": "python3 benchmarks/rank_balance.py",
        "overrides": list(OVERRIDES),
        "blocks": len(costs),
        "tiles_mean": statistics.fmean(costs),
        "tiles_cv": statistics.pstdev(costs) / statistics.fmean(costs),
        "rows": rows,
    }
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], "rank_balance.json").write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{len(costs)} blocks, {result['tiles_mean']:.1f} computed tiles each on average "
        f"(coefficient of variation {result['tiles_cv']:.2f})"
    )
    print("the step's costliest rank above the ranks' mean, % of one block's mean attention work")
    header = ["ranks", "random (DistributedSampler)", *(f"balanced, window {w} steps" for w in WINDOWS)]
    print(" | ".join(header))
    for row in rows:
        cells = [row["random"], *(row[f"window_{w}"] for w in WINDOWS)]
        print(" | ".join([str(row["ranks"]), *(f"{c:.1f}" for c in cells)]))


if __name__ == "__main__":
    main()
