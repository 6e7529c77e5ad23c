"""Numeric precision of a run: parameter dtypes, autocast, loss scaling, TF32, fp8 layers.

| precision | frozen weights | trained weights | compute |
|---|---|---|---|
| fp32 | fp32 | fp32 | fp32 (TF32 matmuls only with precision.allow_tf32) |
| bf16 | bf16 | bf16 | bf16 |
| fp16 | fp16 | fp32 | fp16 autocast, dynamic loss scaling |
| fp8  | bf16 | bf16 | fp8 GEMMs in the decoder's linear layers (Transformer Engine or torchao), bf16 elsewhere |

LoRA adapters keep the trained dtype, so in bf16 no activation is ever upcast to fp32 on the way
through an adapter (peft's default keeps fp32 adapters, which costs more than LoRA saves).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from ghsweep.config.schema import PrecisionSchema, carried
from ghsweep.train.optimizer import clip_gradients

_DTYPES = {
    "fp32": (torch.float32, torch.float32, None),
    "bf16": (torch.bfloat16, torch.bfloat16, None),
    "fp16": (torch.float16, torch.float32, torch.float16),
    "fp8": (torch.bfloat16, torch.bfloat16, None),
}


class Precision:
    """Wraps forward/backward/step so the training loop reads the same for every precision."""

    def __init__(self, precision_config: PrecisionSchema, device: torch.device):
        self.name = precision_config.name
        self.device = device
        self.frozen_dtype, self.trained_dtype, self.autocast_dtype = _DTYPES[self.name]
        if device.type == "cuda":
            allow_tf32 = self.name == "fp32" and bool(precision_config.allow_tf32)
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32
            torch.backends.cudnn.allow_tf32 = allow_tf32
        self.scaler: torch.amp.GradScaler | None = None
        if self.name == "fp16":
            initial_scale = carried(precision_config.initial_loss_scale, "precision.initial_loss_scale")
            self.scaler = torch.amp.GradScaler(device.type, init_scale=initial_scale)
        # Set by fp8.apply_fp8 when Transformer Engine runs the fp8 layers (it needs its own region).
        self.fp8_region: Callable[[], contextlib.AbstractContextManager] | None = None

    @contextlib.contextmanager
    def forward_region(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if self.autocast_dtype is not None:
                stack.enter_context(torch.autocast(self.device.type, dtype=self.autocast_dtype))
            if self.fp8_region is not None:
                stack.enter_context(self.fp8_region())
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], max_norm: float | None) -> None:
        """Clip the gradients to `max_norm` (None: no clipping), then step; fp16 unscales first."""
        if self.scaler:
            self.scaler.unscale_(optimizer)
            clip_gradients(params, max_norm)
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            clip_gradients(params, max_norm, optimizer)
            optimizer.step()
