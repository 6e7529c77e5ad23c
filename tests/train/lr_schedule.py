"""Checks that another library's scheduler steps the torch backend's learning rates (schedule.lr_factor)."""

from __future__ import annotations

import pytest

from ghsweep.config.schema import TrainSchema
from ghsweep.train.schedule import lr_factor, warmup_steps


def assert_steps_the_torch_backend_s_rates(theirs: list[float], train: TrainSchema) -> None:
    """`theirs`, a scheduler's rate at each step of `train`, is the torch backend's warm-up exactly,
    its peak and floor, and its decay within one step."""
    ours = [
        train.lr * lr_factor(k, train.max_steps, train.lr_schedule, train.lr_warmup_ratio, train.min_lr_ratio)
        for k in range(train.max_steps)
    ]
    warmup = warmup_steps(train.max_steps, train.lr_warmup_ratio)
    assert theirs[:warmup] == pytest.approx(ours[:warmup])
    assert theirs[-1] == pytest.approx(ours[-1]) and max(theirs) == pytest.approx(train.lr)
    for k in range(warmup, train.max_steps):
        assert min(ours[k - 1 : k + 2]) - 1e-12 <= theirs[k] <= max(ours[k - 1 : k + 2]) + 1e-12
