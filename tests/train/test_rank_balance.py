"""dataloader.balance_ranks: the ranks' blocks at a step cost about the same, and every rank still
reads its own share of a shuffled round of the data, as DistributedSampler's ranks do."""

from __future__ import annotations

import random
import statistics

import pytest
import torch
from torch.utils.data import DistributedSampler

from ghsweep.train import dolly_data as dolly
from ghsweep.train.rank_balance import WINDOW_STEPS, BalancedDistributedSampler
from ghsweep.train.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


class Blocks(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def skewed_costs(n: int, seed: int = 0) -> list[float]:
    """Block costs as long-tailed as packed documents' attention work (coefficient of variation ~0.5+)."""
    rng = random.Random(seed)
    return [rng.lognormvariate(0, 0.6) for _ in range(n)]


def per_rank(samplers: list[DistributedSampler]) -> list[list[int]]:
    return [list(s) for s in samplers]


def step_excess(blocks: list[list[int]], costs: list[float], batch: int) -> float:
    """Mean over steps of the costliest rank's work above the ranks' mean."""
    steps = range(0, len(blocks[0]) - batch + 1, batch)
    work = [[sum(costs[i] for i in rank[s : s + batch]) for rank in blocks] for s in steps]
    return statistics.fmean(max(w) - statistics.fmean(w) for w in work)


@pytest.mark.parametrize("n, ranks, batch", [(121, 2, 1), (121, 4, 1), (100, 2, 2), (7, 2, 1)])
def test_the_ranks_read_disjoint_shares_of_one_shuffled_round(n, ranks, batch):
    costs = skewed_costs(n)
    samplers = [BalancedDistributedSampler(Blocks(n), costs, ranks, r, 3, batch) for r in range(ranks)]
    blocks = per_rank(samplers)
    assert all(len(b) == len(samplers[0]) == n // ranks for b in blocks)
    seen = [i for b in blocks for i in b]
    assert len(set(seen)) == len(seen) == ranks * (n // ranks)
    # As DistributedSampler with drop_last: the blocks a round leaves out are those past its shuffle's cut.
    reference = [
        list(DistributedSampler(Blocks(n), ranks, r, shuffle=True, seed=3, drop_last=True)) for r in range(ranks)
    ]
    assert set(seen) == {i for b in reference for i in b}


def test_the_same_seed_and_epoch_deal_the_same_blocks_and_a_new_epoch_reshuffles():
    costs = skewed_costs(121)
    make = lambda seed: BalancedDistributedSampler(Blocks(121), costs, 2, 1, seed, 1)  # noqa: E731
    first, again = make(5), make(5)
    assert list(first) == list(again)
    again.set_epoch(1)
    assert list(first) != list(again)
    assert list(make(6)) != list(first)


@pytest.mark.parametrize("ranks, batch", [(2, 1), (4, 1), (2, 2)])
def test_a_steps_costliest_rank_is_closer_to_the_mean_than_drawn_at_random(ranks, batch):
    n = 240
    costs = skewed_costs(n, seed=1)
    drawn, dealt = [], []
    for epoch in range(20):
        plain = [DistributedSampler(Blocks(n), ranks, r, shuffle=True, seed=0, drop_last=True) for r in range(ranks)]
        balanced = [BalancedDistributedSampler(Blocks(n), costs, ranks, r, 0, batch) for r in range(ranks)]
        for s in (*plain, *balanced):
            s.set_epoch(epoch)
        drawn.append(step_excess(per_rank(plain), costs, batch))
        dealt.append(step_excess(per_rank(balanced), costs, batch))
    assert statistics.fmean(dealt) < 0.5 * statistics.fmean(drawn)


def test_a_step_takes_its_blocks_from_its_own_window_of_the_shuffle():
    # The order a run trains in stays random beyond a window: the blocks of window k are those of the
    # shuffle's k-th slice, only dealt in another order within it.
    n, ranks = 64, 2
    costs = skewed_costs(n)
    samplers = [BalancedDistributedSampler(Blocks(n), costs, ranks, r, 9, 1) for r in range(ranks)]
    blocks = per_rank(samplers)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(9)).tolist()
    window = WINDOW_STEPS * ranks
    for start in range(0, n, window):
        steps = range(start // ranks, (start + window) // ranks)
        assert {b[s] for b in blocks for s in steps} == set(order[start : start + window])


def test_equal_costs_leave_nothing_to_balance_and_a_wrong_count_is_refused():
    samplers = [BalancedDistributedSampler(Blocks(10), [1.0] * 10, 2, r, 0, 1) for r in range(2)]
    assert step_excess(per_rank(samplers), [1.0] * 10, 1) == 0
    with pytest.raises(ValueError, match="9 block costs for 10 blocks"):
        BalancedDistributedSampler(Blocks(10), [1.0] * 9, 2, 0, 0, 1)


def test_the_loader_deals_by_cost_only_where_costs_are_given_on_several_ranks():
    blocks = dolly.pack((dolly.tokenize(r, TOK) for r in dolly.synthetic_dolly(60, seed=3)), 256, TOK.pad_token_id)
    dataset = dolly.PackedDataset(blocks)
    made = lambda **kw: dolly.make_dataloader(dataset, 1, 0, 0, False, None, False, **kw)  # noqa: E731
    costs = [1.0] * len(dataset)
    assert type(made(rank=1, world_size=2, block_costs=costs).sampler) is BalancedDistributedSampler
    assert type(made(rank=1, world_size=2).sampler) is DistributedSampler
    assert not isinstance(made(block_costs=costs).sampler, DistributedSampler)
