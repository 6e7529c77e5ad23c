"""NeMo's Megatron optimizer where neither Transformer Engine nor apex is installed.

megatron.core.optimizer then falls back to `torch.optim.AdamW` with PyTorch's default multi-tensor
step, whose `_foreach_sqrt` allocates a copy of every fp32 `exp_avg_sq` it steps at once: 27 GB at
Llama-2-7B shape, on top of the 18 bytes a parameter Megatron keeps for full fine-tuning (bf16
weights, fp32 gradients, master weights and two Adam states: 121 GB). That is what ran out of
memory on one 141 GB GPU. Megatron's choice where the packages are there, TE's or apex's FusedAdam,
steps in place; so does PyTorch's fused AdamW kernel, which `MegatronOptimizerWithFusedTorchAdam`
selects.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from nemo.lightning.pytorch.optim import MegatronOptimizerModule


def megatron_uses_torch_adam() -> bool:
    """Whether megatron.core.optimizer falls back to PyTorch's AdamW (it prefers TE's, then apex's)."""
    return importlib.util.find_spec("transformer_engine") is None and importlib.util.find_spec("apex") is None


def use_fused_kernel(param_groups: list[dict[str, Any]]) -> None:
    """Make `torch.optim.Adam`/`AdamW` step these groups with its fused kernel.

    Both read `fused` and `foreach` from each group at every step, so this works on an optimizer
    that is already built (Megatron builds it inside `get_megatron_optimizer`).
    """
    for group in param_groups:
        group["fused"] = True
        group["foreach"] = False


class MegatronOptimizerWithFusedTorchAdam(MegatronOptimizerModule):
    """NeMo's `MegatronOptimizerModule`, its PyTorch AdamW stepped by the fused kernel."""

    def optimizers(self, model: Any) -> list[torch.optim.Optimizer]:
        optimizers = super().optimizers(model)
        for optimizer in optimizers:
            # Megatron's param_groups are its inner torch optimizer's own dicts (NeMo's
            # setup_megatron_optimizer sets learning rates through them as well).
            use_fused_kernel(optimizer.param_groups)
        return optimizers
