"""Numeric precision of a run: autocast region, loss scaling, TF32."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from omegaconf import DictConfig

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """Wraps forward/backward/step so the training loop reads the same for every precision."""

    def __init__(self, precision_cfg: DictConfig, device: torch.device):
        self.name = precision_cfg.name
        self.device = device
        if self.name == "fp8":
            raise NotImplementedError(
                "precision=fp8 is not available in the torch backend yet; accepted here: fp32, fp16, bf16"
            )
        if device.type == "cuda":
            allow_tf32 = self.name == "fp32" and bool(precision_cfg.get("allow_tf32", False))
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32
            torch.backends.cudnn.allow_tf32 = allow_tf32
        self.scaler = (
            torch.amp.GradScaler(device.type, init_scale=precision_cfg.initial_loss_scale)
            if self.name == "fp16"
            else None
        )

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        dtype = AUTOCAST_DTYPES.get(self.name)
        if dtype is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
