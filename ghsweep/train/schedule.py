"""The learning-rate schedule, as a multiple of the peak rate at each step: plain arithmetic, so the
NeMo and AutoModel configs (built without torch) give their own schedulers the same one.

The peak rate comes per model and per peft (`model.lr.lora`, `model.lr.none`; for Llama-2-7B
NeMo's fine-tuning recipe: 1e-4 for LoRA, 5e-6 for full fine-tuning). The schedule warms up
linearly over `train.lr_warmup_ratio` of the steps, then decays to `train.min_lr_ratio` of the
peak: cosine (NeMo's and most recipes' choice), linear, or constant.
"""

from __future__ import annotations

import math


def warmup_steps(max_steps: int, warmup_ratio: float) -> int:
    """How many steps the rate warms up over (the other backends' schedulers are given the same)."""
    return math.ceil(warmup_ratio * max_steps)


def lr_factor(step: int, max_steps: int, schedule: str, warmup_ratio: float, min_ratio: float) -> float:
    """The multiple of the peak rate used at `step` (0-based)."""
    warmup = warmup_steps(max_steps, warmup_ratio)
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    # Steps past max_steps (a run measuring until its interval is narrow, train.measure) stay at the floor.
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup - 1))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return min_ratio + (1 - min_ratio) * decay
