"""`python -m ghsweep.bench.optimizer_step`: what it steps and the bytes it counts. (Imports inside the
tests: the NeMo and AutoModel environments collect this module without torchao.)"""

from __future__ import annotations

import pytest
import torch

from ghsweep.train.flops import ModelShape

TINY = ModelShape(
    hidden_size=64, intermediate_size=176, num_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=256
)


def test_the_tensors_are_llama_2_7b_trained_ones():
    from ghsweep.bench.optimizer_step import BYTES_PER_PARAM, llama_tensors

    params = llama_tensors(32, torch.device("meta"))
    assert len(params) == 291  # embedding, lm head, final norm, 32 x (7 projections + 2 norms)
    assert sum(p.numel() for p in params) == 6_738_415_616  # what the benchmark's full fine-tuning rows train
    assert all(p.dtype == torch.bfloat16 and p.grad is not None for p in params)
    assert BYTES_PER_PARAM * sum(p.numel() for p in params) / 1e9 > 94


@pytest.mark.cli  # compiled optimizer steps run the C++ compiler
def test_each_optimizer_steps_and_the_copy_floor_is_last():
    from ghsweep.bench.optimizer_step import measure

    rows = measure(2, torch.device("cpu"), TINY)
    names = [name for name, _ in rows]
    # Off a GPU the Triton kernel is not what adamw_sr steps with, so it has no row.
    assert names == [
        "adamw (torch, fused on a GPU)",
        "adamw_sr, torchao's step compiled once",
        "copy of the same bytes",
    ]
    assert all(ms > 0 for _, ms in rows)
