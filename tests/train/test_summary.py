"""The worker summary's compile time: what torch.compile took in this process, read from dynamo's timers."""

from __future__ import annotations

import torch

from ghsweep.train.summary import compile_seconds


def test_compile_seconds_grow_by_each_compile_and_not_by_compiled_calls():
    before = compile_seconds() or 0.0

    # A function of its own: dynamo has not seen its code, so the first call traces it.
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + 1

    compiled = torch.compile(scaled, backend="eager")
    compiled(torch.randn(4))
    after_compile = compile_seconds()
    assert after_compile is not None and after_compile > before
    for _ in range(3):
        compiled(torch.randn(4))  # the same shapes: the cached code runs, nothing is traced
    assert compile_seconds() == after_compile
