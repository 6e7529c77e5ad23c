"""AdamW, its learning-rate schedule (schedule.py) and gradient clipping, as fine-tuning recipes set
them. Gradients are clipped to a global norm of `train.grad_clip` (1.0 in NeMo and transformers' Trainer).

`train.optimizer` picks what steps the weights. A bf16 weight keeps 8 significant bits, so rounding
a step's result to the nearest bf16 drops every update smaller than half the weight's last bit: for
a weight of 0.02 that is 6.1e-5, and AdamW's update is about the learning rate, 5e-6 for Llama-2-7B
full fine-tuning. torch's AdamW on bf16 weights applies 7% of its update there (30 steps over
N(0, 0.02) weights, against the same steps in fp32; tests/train/test_optim.py). torchao's AdamW
with bf16 stochastic rounding rounds up with the probability of the remainder, so every update
lands in expectation, at the memory of pure bf16 (no fp32 master weights). `auto` takes it for full
fine-tuning in bf16 and torch's fused AdamW otherwise: LoRA's adapters start at or near zero, where
bf16 steps are fine, and torchao steps tensor by tensor while torch's fused kernel takes all of a
model's hundreds of adapter tensors at once. `adamw8bit` is torchao's AdamW8bit (8-bit states: 2
bytes a parameter less), also stochastically rounded. torchao_adamw.py steps both (adamw_sr on a GPU
with one Triton kernel a tensor, adamw_kernel.py).

With `train.optimizer_in_backward` (AdamStepsInBackward) each tensor is stepped by its own AdamW as
soon as its gradient is accumulated, while backward goes on through earlier layers, and its gradient
is freed at once: the optimizer's memory traffic hides behind backward compute and the gradients of
the whole model never exist together. A global norm needs every gradient before the first step, so
there `train.grad_clip` clips each tensor's gradient to that norm on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ghsweep.config.schema import TrainSchema
from ghsweep.train.schedule import lr_factor


def optimizer_for(choice: str, peft: str, trained_dtype: torch.dtype) -> str:
    """What `train.optimizer=choice` steps in this run: adamw, adamw_sr or adamw8bit."""
    if choice != "auto":
        return choice
    return "adamw_sr" if peft == "none" and trained_dtype == torch.bfloat16 else "adamw"


def make_optimizer(
    params: Iterable[torch.nn.Parameter], train: TrainSchema, device: torch.device, kind: str = "adamw"
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW of `kind` (see `optimizer_for`) over `params`, with its learning-rate schedule."""
    optimizer: Any
    if kind == "adamw":
        optimizer = torch.optim.AdamW(
            list(params), lr=train.lr, weight_decay=train.weight_decay, fused=device.type == "cuda"
        )
    else:
        from ghsweep.train.torchao_adamw import StochasticAdamW, StochasticAdamW8bit

        torchao_adamw = StochasticAdamW8bit if kind == "adamw8bit" else StochasticAdamW
        optimizer = torchao_adamw(list(params), lr=train.lr, weight_decay=train.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(step, train.max_steps, train.lr_schedule, train.lr_warmup_ratio, train.min_lr_ratio),
    )
    return optimizer, schedule


class AdamStepsInBackward:
    """One AdamW (and its schedule) per trained tensor, stepped from the tensor's
    post-accumulate-grad hook; the training loop only ends the step.

    On a GPU the steps run on a side stream, so AdamW's memory-bound kernels run beside the
    backward kernels of earlier layers instead of after all of them.
    """

    def __init__(
        self, params: Iterable[torch.nn.Parameter], train: TrainSchema, device: torch.device, kind: str = "adamw"
    ):
        self.max_norm = train.grad_clip
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.optimizers: dict[torch.nn.Parameter, torch.optim.Optimizer] = {}
        self.schedules = []
        for param in params:
            self.optimizers[param], schedule = make_optimizer([param], train, device, kind)
            self.schedules.append(schedule)
            param.register_post_accumulate_grad_hook(self._step)

    def _step(self, param: torch.nn.Parameter) -> None:
        if self.stream is not None:
            # The gradient (and every use of the weight in this backward) is queued before this point.
            self.stream.wait_stream(torch.cuda.current_stream())
            assert param.grad is not None, "a post-accumulate-grad hook runs once the gradient is accumulated"
            param.grad.record_stream(self.stream)
        with torch.cuda.stream(self.stream):  # None (CPU): a no-op, the step runs where it is
            clip_gradients([param], self.max_norm, self.optimizers[param])
            self.optimizers[param].step()
        param.grad = None

    def end_step(self) -> None:
        """Advance the schedules; the next forward waits for the last weight updates."""
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
        for schedule in self.schedules:
            schedule.step()


def clip_gradients(
    params: list[torch.nn.Parameter], max_norm: float | None, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """Clip to a global norm without a host sync (the norm stays on the device).

    Given torch's fused AdamW (whole gradients) or torchao's (torchao_adamw.py; whole gradients or
    FSDP2's shards), the clip is folded into its next step instead: its `grad_scale` (the attribute
    through which GradScaler hands fused optimizers a divisor) divides every gradient inside the AdamW
    kernel, which saves a read and a write of every gradient (27 GB a step for full fine-tuning of a
    7B model in bf16 on one GPU, each rank's share of it under FSDP2).
    """
    if max_norm is None:
        return
    grads = [p.grad for p in params if p.grad is not None]
    # FSDP2's gradients are shards (DTensors): torchao_adamw's optimizers step each rank's shard and
    # declare `grad_scale`; torch's fused AdamW reads it in its kernel, on whole (DDP, one GPU) tensors.
    sharded = any(isinstance(g, DTensor) for g in grads)
    folds = optimizer is not None and (
        hasattr(optimizer, "grad_scale") or (optimizer.defaults.get("fused") and not sharded)
    )
    if optimizer is None or not folds:
        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        return
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()  # the global norm over every rank's shard, as a plain tensor
    # clip_grad_norm_ multiplies by min(1, max_norm / (norm + 1e-6)); the step divides by its inverse.
    # Read by the fused optimizers' step (getattr), undeclared in torch's Optimizer annotations.
    optimizer.grad_scale = ((norm.float() + 1e-6) / max_norm).clamp(min=1.0)  # type: ignore[attr-defined]
