"""`python -m ghsweep.bench.optimizer_step [--layers N]`: one AdamW step over Llama-2-7B's trained
tensors in bf16 (full fine-tuning), each way ghsweep can step them, beside a copy of the bytes the
step must move (weights, gradients and two states: 14 bytes a parameter), the floor for any of them.

Times are the mean of 5 steps after 3 warm-up steps, on one device.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torchao.optim import _AdamW

from ghsweep.bench.rows import compose_ours
from ghsweep.train.flops import ModelShape
from ghsweep.train.torchao_adamw import StochasticAdamW, _CompiledOnce

# As the benchmark's rows compose it (conf/model/llama2_7b.yaml).
LLAMA2_7B = ModelShape.of_model(compose_ours([], seq=4096, steps=1, warmup=0, layers=32).model)

BYTES_PER_PARAM = 14  # read weight, gradient, exp_avg, exp_avg_sq (2 bytes each); write all but the gradient


class _TorchaoCompiledAdamW(_CompiledOnce, _AdamW):
    """adamw_sr as it steps off a GPU: torchao's own arithmetic, compiled once."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        super().__init__(params, lr=5e-6, weight_decay=0.0, bf16_stochastic_round=True)


def llama_tensors(layers: int, device: torch.device, shape: ModelShape = LLAMA2_7B) -> list[torch.nn.Parameter]:
    """The trained tensors of a Llama model of `shape` with `layers` decoder layers, with gradients."""
    hidden, inner, vocab = shape.hidden_size, shape.intermediate_size, shape.vocab_size
    per_layer = [(hidden, hidden)] * 4 + [(inner, hidden)] * 3 + [(hidden,)] * 2
    shapes = [(vocab, hidden), (vocab, hidden), (hidden,)] + layers * per_layer
    params = [torch.nn.Parameter(torch.randn(s, device=device, dtype=torch.bfloat16) * 0.02) for s in shapes]
    for param in params:
        param.grad = torch.randn_like(param) * 1e-3
    return params


def mean_ms(step: Callable[[], object], device: torch.device, warmup: int = 3, steps: int = 5) -> float:
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / steps
    began = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - began) * 1000 / steps


def measure(layers: int, device: torch.device, shape: ModelShape = LLAMA2_7B) -> list[tuple[str, float]]:
    """(what stepped, ms a step) for each optimizer, then the copy of the same bytes."""
    params = llama_tensors(layers, device, shape)
    optimizers: dict[str, Callable[[], torch.optim.Optimizer]] = {
        "adamw (torch, fused on a GPU)": lambda: torch.optim.AdamW(params, lr=5e-6, fused=device.type == "cuda"),
        "adamw_sr, torchao's step compiled once": lambda: _TorchaoCompiledAdamW(params),
    }
    if device.type == "cuda":
        optimizers["adamw_sr, the Triton kernel (the default)"] = lambda: StochasticAdamW(params, 5e-6, 0.0)
    times = []
    for name, make in optimizers.items():
        optimizer = make()
        times.append((name, mean_ms(optimizer.step, device)))
        del optimizer  # and its states, before the next one makes its own
    step_bytes = BYTES_PER_PARAM * sum(p.numel() for p in params)
    params.clear()  # the weights and gradients, before the copy's buffers
    # A copy of a quarter of the bytes reads and writes half of them: twice its time is the floor.
    source = torch.empty(step_bytes // 4, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    times.append(("copy of the same bytes", mean_ms(lambda: target.copy_(source), device) * 2))
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ghsweep.bench.optimizer_step", description=__doc__)
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (32 = Llama-2-7B)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    params = sum(p.numel() for p in llama_tensors(args.layers, torch.device("meta")))
    step_gb = BYTES_PER_PARAM * params / 1e9
    print(f"{params / 1e9:.2f} B bf16 parameters, {step_gb:.1f} GB moved a step, on {device}")
    print(f"{'optimizer step':44s} {'ms':>8s} {'GB/s':>8s}")
    for name, ms in measure(args.layers, device):
        print(f"{name:44s} {ms:8.2f} {step_gb / ms * 1000:8.0f}")


if __name__ == "__main__":
    main()
