"""backend=nemo without Transformer Engine or apex: Megatron's PyTorch AdamW is stepped by PyTorch's
fused kernel (ghsweep.train.nemo.megatron_optimizer), checked on CPU in the NeMo environment."""

from __future__ import annotations

import pytest
import torch

from tests.support.nemo_recipes import recipe_of

pytestmark = [pytest.mark.nemo, pytest.mark.usefixtures("nemo_llm")]


def test_the_fallback_is_detected_as_megatron_detects_it():
    from megatron.core import optimizer as megatron_optimizer

    from ghsweep.train.nemo.megatron_optimizer import megatron_uses_torch_adam

    assert megatron_uses_torch_adam() == megatron_optimizer.USING_PYTORCH_OPTIMIZER


def test_the_recipe_selects_the_fused_kernel_where_megatron_falls_back_to_torch(tmp_path):
    from nemo.lightning.pytorch.optim import MegatronOptimizerModule

    from ghsweep.train.nemo.megatron_optimizer import MegatronOptimizerWithFusedTorchAdam, megatron_uses_torch_adam

    recipe, _ = recipe_of(tmp_path, "peft=none")
    expected = MegatronOptimizerWithFusedTorchAdam if megatron_uses_torch_adam() else MegatronOptimizerModule
    assert recipe.optim.__fn_or_cls__ is expected
    assert recipe.optim.config.lr == recipe_of(tmp_path, "peft=none")[1].train.lr


def _megatron_style_adamw(params: list[torch.Tensor]) -> torch.optim.AdamW:
    # As megatron.core.optimizer builds it without TE or apex: two groups (with and without decay),
    # Megatron's extra keys in each, PyTorch's defaults for everything else.
    groups = [
        {"params": params[:2], "wd_mult": 1.0, "lr_mult": 1.0, "is_expert_parallel": False},
        {"params": params[2:], "wd_mult": 0.0, "lr_mult": 1.0, "is_expert_parallel": False, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)


def _ops_of_two_steps(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in range(2):
            for i, p in enumerate(params):
                p.grad = torch.full_like(p, 0.01 * (i + 1) * (step + 1))
            optimizer.step()
    return {e.key for e in prof.key_averages()}


def test_the_built_optimizer_steps_with_the_fused_kernel_and_the_same_arithmetic():
    from ghsweep.train.nemo.megatron_optimizer import use_fused_kernel

    torch.manual_seed(0)
    start = [torch.randn(64, 32), torch.randn(32), torch.randn(16, 16), torch.randn(16)]
    fused_params = [p.clone().requires_grad_() for p in start]
    reference_params = [p.clone().requires_grad_() for p in start]
    fused = _megatron_style_adamw(fused_params)
    use_fused_kernel(fused.param_groups)
    fused_ops = _ops_of_two_steps(fused, fused_params)
    reference_ops = _ops_of_two_steps(_megatron_style_adamw(reference_params), reference_params)

    # Without the switch PyTorch picks its multi-tensor step on a GPU (whose copy of exp_avg_sq ran
    # a 7B run out of memory) and its per-tensor step on CPU; with it, the fused kernel on either.
    assert "aten::_fused_adamw_" not in reference_ops
    assert "aten::_fused_adamw_" in fused_ops and "aten::_foreach_sqrt" not in fused_ops
    for a, b, s in zip(fused_params, reference_params, start):
        assert not torch.equal(a, s)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
