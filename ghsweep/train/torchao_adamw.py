"""torchao's AdamW (bf16 stochastic rounding; 8-bit states for `AdamW8bit`), stepped with the
gradient clip folded into each tensor's step.

On a GPU `StochasticAdamW` steps each tensor with one Triton kernel (adamw_kernel.py: torchao's
arithmetic, a cheaper random source). Elsewhere, and for `AdamW8bit`, torchao's own per-tensor step
is used, compiled once: torchao's `step` wraps it in a new `torch.compile` every call
(pytorch/ao#2500), about 0.2 ms of Python a tensor, 60 ms a step for Llama-2-7B's 291 tensors.
Each tensor shape still gets its own graph (static shapes, as torchao compiles it). The step
divides each gradient by `grad_scale`, the attribute through which `optim.clip_gradients` hands
torch's fused AdamW the clip: no separate pass over the gradients.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor
from torchao.optim import AdamW8bit, _AdamW
from torchao.optim.adam import single_param_adam

from ghsweep.train.fp8_cached import TrainedFp8Linear


def _adamw_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    grad_divisor: torch.Tensor | None,
    step: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    lr: torch.Tensor,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
    stochastic_round: bool,
) -> None:
    if grad_divisor is not None:
        grad = grad / grad_divisor
    single_param_adam(
        param, grad, step, exp_avg, exp_avg_sq, None, lr, beta1, beta2, weight_decay, eps, True, stochastic_round
    )


_compiled_adamw_step = torch.compile(_adamw_step, fullgraph=True, dynamic=False)


class _CompiledOnce:
    """Replaces torchao's `step`; mixed into its optimizer classes (AdamW, without amsgrad)."""

    # torchao's optimizer's (annotations only: the mixin must not shadow them).
    state: dict
    param_groups: list[dict]
    bf16_stochastic_round: bool
    _new_buffer: Callable[[torch.Tensor, bool], torch.Tensor]
    # The clip's divisor (a 0-dim device tensor), set before each step by optim.clip_gradients.
    grad_scale: torch.Tensor | None = None

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        # One graph per tensor shape, as many as the model has: more than dynamo's default cache limit.
        with torch._dynamo.utils.disable_cache_limit():
            tensors = [(group, p) for group in self.param_groups for p in group["params"]]
            for index, (group, p) in enumerate(tensors):
                grad = p.grad
                if grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = self._new_buffer(p, True)
                    state["exp_avg_sq"] = self._new_buffer(p, False)
                state["step"] += 1
                self._step_tensor(p, grad, state, group, index)

    def _step_tensor(self, param: torch.Tensor, grad: torch.Tensor, state: dict, group: dict, index: int) -> None:
        beta1, beta2 = group["betas"]
        # param.detach(): torch.compile and FSDP2's DTensor parameters (torchao's own reason, ao#652).
        _compiled_adamw_step(
            param.detach(),
            grad,
            self.grad_scale,
            state["step"],
            state["exp_avg"],
            state["exp_avg_sq"],
            group["lr"],
            beta1,
            beta2,
            group["weight_decay"],
            group["eps"],
            self.bf16_stochastic_round and param.dtype is torch.bfloat16,
        )


class StochasticAdamW(_CompiledOnce, _AdamW):
    """torchao's AdamW; bf16 weights rounded stochastically. On a GPU, one Triton kernel a tensor,
    which also writes the fp8 copy of a weight in `fp8_layers` (weight -> its TrainedFp8Linear)."""

    def __init__(self, params, lr: float, weight_decay: float) -> None:
        super().__init__(params, lr=lr, weight_decay=weight_decay, bf16_stochastic_round=True)
        self.fp8_layers: dict[torch.Tensor, TrainedFp8Linear] = {}

    def _step_tensor(self, param: torch.Tensor, grad: torch.Tensor, state: dict, group: dict, index: int) -> None:
        tensors = [_local(t) for t in (param, grad, state["exp_avg"], state["exp_avg_sq"])]
        # The kernel walks flat memory; a strided shard (none that FSDP2 makes today) takes torchao's step.
        if not param.is_cuda or not all(t.is_contiguous() for t in tensors):
            super()._step_tensor(param, grad, state, group, index)
            return
        from ghsweep.train.adamw_kernel import adamw_step

        step = int(state["step"])
        fp8_layer = self.fp8_layers.get(param)
        # Every data-parallel replica must round alike: the seed depends on the step and the tensor only.
        adamw_step(
            *tensors,
            step=step,
            lr=float(group["lr"]),
            betas=group["betas"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            grad_divisor=self.grad_scale,
            seed=(step * 1_000_003 + index) % 2**31,
            fp8_cast=None if fp8_layer is None else fp8_layer.fused_cast(),
        )


class StochasticAdamW8bit(_CompiledOnce, AdamW8bit):
    """torchao's AdamW with 8-bit states (blocks of 256 values; tensors under 4,096 values keep
    their dtype); bf16 weights rounded stochastically."""

    def __init__(self, params, lr: float, weight_decay: float) -> None:
        super().__init__(params, lr=lr, weight_decay=weight_decay, bf16_stochastic_round=True)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) parameter, gradient or state; the tensor otherwise."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
