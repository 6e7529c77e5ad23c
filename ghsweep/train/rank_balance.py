"""Which packed blocks each rank reads at each step, so that the ranks' work at a step matches
(dataloader.balance_ranks).

Every block holds seq_length tokens, but its attention work grows with its documents' lengths: with
document masking FlexAttention computes only the tiles where a document meets itself, and on the
7B line's data (dolly_synthetic, 121 blocks of 4096 tokens) a block's computed tiles vary by 50%
(coefficient of variation). Data-parallel ranks wait for each other at every step, so a step takes
as long as its costliest rank: drawn at random, as DistributedSampler draws them, the costlier of two
blocks computes 21% of a mean block's tiles more than the two's mean, and the costliest of four 49%
more. Dealing each window of steps' blocks in cost order, so that a step's blocks cost about the same,
leaves 7.4% and 15% (`python3 benchmarks/rank_balance.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Dataset, DistributedSampler

# Steps whose blocks are dealt together. A step's blocks come from its own window, drawn at random, so the
# order a run trains in stays as random as before at the scale of this many steps. A wider window matches
# costs more closely but orders more of a run (2 ranks: 10.8% at 4 steps, 7.4% at 8, 4.7% at 16).
WINDOW_STEPS = 8


class BalancedDistributedSampler(DistributedSampler):
    """DistributedSampler (shuffled, the last incomplete round dropped) whose ranks read blocks of about
    the same cost at each step: each window of WINDOW_STEPS steps' blocks, drawn at random, is sorted
    by `costs`, cut into groups of one block per rank, and the groups are dealt to steps in a random
    order. Every rank sees each block of a round at most once, and the ranks' blocks never overlap.

    `costs[i]`: block i's work (packed_attention.computed_tiles); `batch_size`: blocks per rank a step.
    """

    def __init__(
        self,
        dataset: Dataset,
        costs: Sequence[float],
        num_replicas: int,
        rank: int,
        seed: int,
        batch_size: int,
        window_steps: int = WINDOW_STEPS,
    ):
        super().__init__(dataset, num_replicas, rank, shuffle=True, seed=seed, drop_last=True)
        if len(costs) != len(dataset):  # type: ignore[arg-type]
            raise ValueError(f"{len(costs)} block costs for {len(dataset)} blocks")  # type: ignore[arg-type]
        self.costs = list(costs)
        self.batch_size = batch_size
        self.window_steps = window_steps

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.costs), generator=generator).tolist()[: self.total_size]
        ranks = self.num_replicas
        window = self.window_steps * self.batch_size * ranks
        mine: list[int] = []
        for start in range(0, len(order), window):
            by_cost = sorted(order[start : start + window], key=self.costs.__getitem__)
            groups = [by_cost[i : i + ranks] for i in range(0, len(by_cost), ranks)]
            for position, g in enumerate(torch.randperm(len(groups), generator=generator).tolist()):
                # Within a group the last rank holds the costliest block; alternating the direction keeps one
                # rank from holding it in every group of a micro-batch of several blocks.
                group = groups[g] if position % 2 == 0 else groups[g][::-1]
                mine.append(group[self.rank])
        return iter(mine)
