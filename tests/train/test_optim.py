"""The learning-rate schedule and gradient clipping of the torch backend."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from ghsweep.train.optim import lr_factor, make_optimizer
from ghsweep.train.precision import Precision


def test_cosine_warms_up_linearly_then_decays_to_the_floor():
    factors = [lr_factor(s, 30, "cosine", 0.1, 0.1) for s in range(30)]
    assert factors[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert factors[3] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[3:], factors[4:]))


def test_linear_and_constant_schedules():
    assert lr_factor(29, 30, "linear", 0.0, 0.0) == pytest.approx(0.0)
    assert lr_factor(15, 31, "linear", 0.0, 0.0) == pytest.approx(0.5)
    assert [lr_factor(s, 10, "constant", 0.2, 0.0) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]


def test_optimizer_follows_the_schedule_and_clips_gradients():
    layer = torch.nn.Linear(4, 4)
    train = OmegaConf.create(
        {
            "lr": 1e-2,
            "weight_decay": 0.0,
            "max_steps": 10,
            "lr_schedule": "cosine",
            "lr_warmup_ratio": 0.2,
            "min_lr_ratio": 0.0,
        }
    )
    params = list(layer.parameters())
    optimizer, schedule = make_optimizer(params, train, torch.device("cpu"))
    precision = Precision(OmegaConf.create({"name": "fp32"}), torch.device("cpu"))
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        (layer(torch.full((2, 4), 100.0)) ** 2).sum().backward()
        precision.step(optimizer, params, max_norm=1.0)
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        assert norm == pytest.approx(1.0, rel=1e-4)
        schedule.step()
        optimizer.zero_grad()
    assert rates[:2] == pytest.approx([5e-3, 1e-2])
    assert rates[-1] < 1e-3


def test_adam_stepped_in_backward_is_adamw_with_per_tensor_clipping():
    """Every tensor stepped from its gradient hook ends where a plain AdamW over the same steps ends
    when each gradient is clipped on its own; no gradient is left held after backward."""
    from ghsweep.train.optim import AdamStepsInBackward, clip_gradients

    train = OmegaConf.create(
        {
            "lr": 1e-2,
            "weight_decay": 0.01,
            "max_steps": 6,
            "lr_schedule": "cosine",
            "lr_warmup_ratio": 0.2,
            "min_lr_ratio": 0.1,
            "grad_clip": 0.5,
        }
    )
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    overlapped = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    overlapped.load_state_dict(reference.state_dict())
    optimizer, schedule = make_optimizer(reference.parameters(), train, torch.device("cpu"))
    in_backward = AdamStepsInBackward(list(overlapped.parameters()), train, torch.device("cpu"))
    inputs = torch.randn(6, 32, 8) * 10
    for x in inputs:
        (reference(x) ** 2).sum().backward()
        for param in reference.parameters():
            clip_gradients([param], train.grad_clip)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        (overlapped(x) ** 2).sum().backward()
        assert all(p.grad is None for p in overlapped.parameters())
        in_backward.end_step()
    for ours, theirs in zip(overlapped.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs)
    assert in_backward.optimizers[next(overlapped.parameters())].param_groups[0]["lr"] == pytest.approx(
        optimizer.param_groups[0]["lr"]
    )


def test_clip_folded_into_a_fused_step_equals_clipping_first():
    """With a fused AdamW the global-norm clip becomes the step's gradient divisor: the weights end
    where clip_grad_norm_ followed by the step puts them."""
    from ghsweep.train.optim import clip_gradients

    torch.manual_seed(0)
    models = [torch.nn.Linear(16, 8) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True) for m in models]
    for _ in range(3):
        x = torch.randn(4, 16) * 100
        for model in models:
            model(x).square().sum().backward()
        torch.nn.utils.clip_grad_norm_(models[0].parameters(), 0.5)
        optimizers[0].step()
        clip_gradients(list(models[1].parameters()), 0.5, optimizers[1])
        assert optimizers[1].grad_scale > 1  # the clip was active
        optimizers[1].step()
        for optimizer in optimizers:
            optimizer.zero_grad()
    for ours, theirs in zip(models[1].parameters(), models[0].parameters()):
        torch.testing.assert_close(ours, theirs)
