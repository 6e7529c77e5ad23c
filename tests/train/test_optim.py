"""The learning-rate schedule and gradient clipping of the torch backend."""

from __future__ import annotations

import pytest
import torch

from ghsweep.config.schema import TrainSchema
from ghsweep.train.optimizer import make_optimizer, optimizer_for
from ghsweep.train.precision import Precision
from ghsweep.train.schedule import lr_factor
from tests.support.compose import compose_typed
from tests.support.gloo_ranks import on_ranks


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
    train = compose_typed().train
    train.lr, train.weight_decay, train.max_steps = 1e-2, 0.0, 10
    train.lr_schedule, train.lr_warmup_ratio, train.min_lr_ratio = "cosine", 0.2, 0.0
    params = list(layer.parameters())
    optimizer, schedule = make_optimizer(params, train, torch.device("cpu"))
    precision = Precision(compose_typed("precision=fp32").precision, torch.device("cpu"))
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
    from ghsweep.train.optimizer import AdamStepsInBackward, clip_gradients

    train = compose_typed().train
    train.lr, train.weight_decay, train.max_steps = 1e-2, 0.01, 6
    train.lr_schedule, train.lr_warmup_ratio, train.min_lr_ratio, train.grad_clip = "cosine", 0.2, 0.1, 0.5
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
    from ghsweep.train.optimizer import clip_gradients

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


def constant_rate(lr: float = 5e-6) -> TrainSchema:
    """30 steps at `lr` (Llama-2-7B full fine-tuning's rate by default), unscheduled, without weight decay."""
    train = compose_typed().train
    train.lr, train.weight_decay, train.max_steps = lr, 0.0, 30
    train.lr_schedule, train.lr_warmup_ratio, train.min_lr_ratio = "constant", 0.0, 1.0
    return train


def applied_share(kind: str, device: str = "cpu") -> float:
    """30 AdamW steps at Llama-2-7B full fine-tuning's rate (5e-6) over bf16 weights drawn like a
    Llama layer's, N(0, 0.02): the share of the fp32 reference's update that reaches the weights."""
    torch.manual_seed(0)
    start = torch.randn(1 << 16, device=device) * 0.02
    grads = [torch.randn(1 << 16, device=device) * 1e-3 + 1e-3 for _ in range(30)]  # a steady direction, and noise
    reference = torch.nn.Parameter(start.bfloat16().float())
    weights = torch.nn.Parameter(start.bfloat16())
    train = constant_rate()
    fp32_adamw, _ = make_optimizer([reference], train, torch.device(device))
    optimizer, _ = make_optimizer([weights], train, torch.device(device), kind)
    for grad in grads:
        reference.grad, weights.grad = grad.bfloat16().float(), grad.bfloat16()
        fp32_adamw.step()
        optimizer.step()
    expected = (reference.detach() - start.bfloat16().float()).sum()
    return float((weights.detach().float() - start.bfloat16().float()).sum() / expected)


def test_adamw_on_bf16_weights_drops_most_small_updates():
    # What optim.py's docstring states: 7% of the update reaches bf16 weights rounded to nearest.
    assert applied_share("adamw") == pytest.approx(0.07, abs=0.02)


@pytest.mark.parametrize(
    ("kind", "device"),
    [("adamw_sr", "cpu"), ("adamw8bit", "cpu"), pytest.param("adamw_sr", "cuda", marks=pytest.mark.gpu)],
)
@pytest.mark.cli  # torchao's compiled step runs the C++ compiler
def test_stochastic_rounding_lands_the_whole_update_in_expectation(kind, device):
    # On a GPU adamw_sr steps with ghsweep's Triton kernel, elsewhere with torchao's compiled step.
    assert applied_share(kind, device) == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize(
    ("choice", "peft", "dtype", "expected"),
    [
        ("auto", "none", torch.bfloat16, "adamw_sr"),
        ("auto", "lora", torch.bfloat16, "adamw"),
        ("auto", "none", torch.float32, "adamw"),
        ("adamw8bit", "lora", torch.bfloat16, "adamw8bit"),
        ("adamw", "none", torch.bfloat16, "adamw"),
    ],
)
def test_auto_rounds_stochastically_for_full_fine_tuning_in_bf16(choice, peft, dtype, expected):
    assert optimizer_for(choice, peft, dtype) == expected


@pytest.mark.parametrize("kind", ["adamw", "adamw_sr"])
@pytest.mark.cli  # adamw_sr's compiled step runs the C++ compiler
def test_every_optimizer_step_remakes_the_fp8_copies_of_the_weights_it_stepped(kind):
    """precision=fp8 peft=none on one rank: the layers keep plain bf16 weights, which either AdamW
    steps; after each step their fp8 copies are those of the stepped weights (on a GPU adamw_sr's
    kernel writes them, test_adamw_kernel.py; elsewhere, and after torch's AdamW, a cast does)."""
    from ghsweep.train.fp8 import apply_fp8
    from ghsweep.train.fp8_cached import E4M3, TrainedFp8Linear, _quantise
    from ghsweep.train.torch_train import OptimizerStep

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False)).bfloat16()
    fp8 = compose_typed("precision=fp8", "precision.library=torchao", "precision.scaling=current").precision
    assert apply_fp8(model, fp8, Precision(fp8, torch.device("cpu"))) == "torchao"
    layers = [m for m in model if isinstance(m, TrainedFp8Linear)]
    assert len(layers) == 2
    train = constant_rate(lr=1e-3)
    train.grad_clip, train.optimizer_in_backward = None, False
    optimizer_step = OptimizerStep(
        list(model.parameters()),
        train,
        torch.device("cpu"),
        Precision(compose_typed("precision=bf16").precision, torch.device("cpu")),
        kind,
        layers,
    )
    for step in (1, 2):
        before = [p.detach().clone() for p in model.parameters()]
        model(torch.randn(16, 64, dtype=torch.bfloat16)).float().square().sum().backward()
        optimizer_step()
        for layer, start in zip(layers, before):
            assert (layer.weight != start).float().mean() > 0.5
            expected, scale = _quantise(layer.weight.detach(), E4M3)
            assert layer.casts == step and torch.equal(layer.scale, scale)
            assert torch.equal(layer.weight_fp8.view(torch.uint8), expected.view(torch.uint8))


def two_copies(device: torch.device | str) -> list[torch.nn.Sequential]:
    torch.manual_seed(0)
    models = [
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8)).to(device)
        for _ in range(2)
    ]
    models[1].load_state_dict(models[0].state_dict())
    return models


def clipped_first_and_folded(models: list[torch.nn.Module], device: torch.device, batches: torch.Generator) -> None:
    """Four steps on the same batches: models[0] clipped by clip_grad_norm_ and stepped by torch's AdamW,
    models[1] stepped by torchao's AdamW as ghsweep steps it, the clip divided out inside its step
    (compiled; the Triton kernel on a GPU). fp32 weights: nothing to round."""
    from ghsweep.train.optimizer import clip_gradients

    train = constant_rate(lr=1e-2)
    train.weight_decay = 0.1
    reference, _ = make_optimizer(models[0].parameters(), train, device)
    ours, _ = make_optimizer(models[1].parameters(), train, device, "adamw_sr")
    for _ in range(4):
        x = torch.randn(4, 16, generator=batches).to(device) * 100
        for model in models:
            model(x).square().sum().backward()
        torch.nn.utils.clip_grad_norm_(models[0].parameters(), 0.5)
        reference.step()
        clip_gradients(list(models[1].parameters()), 0.5, ours)
        # Adam hardly moves with a gradient's scale: the divisor itself is held to the global norm (FSDP2's
        # gradients are shards: the norm over all of them).
        whole = torch.cat(
            [getattr(p.grad, "full_tensor", lambda g=p.grad: g)().flatten() for p in models[1].parameters()]
        )
        torch.testing.assert_close(ours.grad_scale, (torch.linalg.vector_norm(whole) + 1e-6) / 0.5)
        assert ours.grad_scale > 1  # the clip was active, and folded
        ours.step()
        for optimizer in (reference, ours):
            optimizer.zero_grad()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.cli  # torchao's compiled step runs the C++ compiler
def test_torchao_adamw_with_the_clip_folded_in_equals_torch_adamw_after_clipping(device):
    models = two_copies(device)
    clipped_first_and_folded(models, torch.device(device), torch.Generator().manual_seed(0))
    for theirs, mine in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(mine, theirs)


def _sharded_clip_steps(ranks, device: torch.device, out) -> None:
    """clipped_first_and_folded with both copies sharded by FSDP2 over the ranks, each rank its own
    batches; rank 0 saves both copies' weights, whole."""
    from torch.distributed.fsdp import fully_shard

    models = two_copies(device)
    for model in models:
        fully_shard(model[0])
        fully_shard(model)
    clipped_first_and_folded(models, device, torch.Generator().manual_seed(ranks.rank))
    weights = [[p.full_tensor() for p in model.parameters()] for model in models]
    if ranks.is_main:
        torch.save(weights, out)


@pytest.mark.cli  # torchao's compiled step runs the C++ compiler
def test_the_clip_folds_into_torchaos_step_over_fsdp2_shards_with_the_global_norm(tmp_path):
    """Under FSDP2 each rank holds a shard of every gradient: the folded clip divides by the norm over
    all ranks' shards, as clip_grad_norm_ does."""
    out = tmp_path / "weights.pt"
    on_ranks(_sharded_clip_steps, 2, out)
    clipped_first, folded = torch.load(out)
    for theirs, mine in zip(clipped_first, folded):
        torch.testing.assert_close(mine, theirs)
