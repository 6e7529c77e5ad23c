"""AdamW, its learning-rate schedule and gradient clipping, as fine-tuning recipes set them.

The peak rate comes per model and per peft (`model.lr.lora`, `model.lr.none`; for Llama-2-7B
NeMo's fine-tuning recipe: 1e-4 for LoRA, 5e-6 for full fine-tuning). The schedule warms up
linearly over `train.lr_warmup_ratio` of the steps, then decays to `train.min_lr_ratio` of the
peak: cosine (NeMo's and most recipes' choice), linear, or constant. Gradients are clipped to a
global norm of `train.grad_clip` (1.0 in NeMo and transformers' Trainer).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from omegaconf import DictConfig

def lr_factor(step: int, max_steps: int, schedule: str, warmup_ratio: float, min_ratio: float) -> float:
    """The multiple of the peak rate used at `step` (0-based)."""
    warmup = math.ceil(warmup_ratio * max_steps)
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, max_steps - warmup - 1)
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return min_ratio + (1 - min_ratio) * decay


def make_optimizer(params: Iterable[torch.nn.Parameter], train: DictConfig, device: torch.device
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.AdamW(list(params), lr=train.lr, weight_decay=train.weight_decay,
                                  fused=device.type == "cuda")
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(
        step, train.max_steps, train.lr_schedule, train.lr_warmup_ratio, train.min_lr_ratio))
    return optimizer, schedule


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float | None) -> None:
    """Clip to a global norm without a host sync (the norm stays on the device)."""
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
