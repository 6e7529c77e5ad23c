"""train.activation_memory_budget: a compiled decoder layer under a lower budget keeps fewer bytes
for backward and computes the same gradients (CPU, torch.compile's own partitioner, set as training sets it)."""

from __future__ import annotations

import copy

import pytest
import torch

from ghsweep.train.torch_train import compile_settings
from tests.support.models import tiny_lora_decoder


def saved_bytes_and_grads(layer: torch.nn.Module, budget: float, x: torch.Tensor, embeddings) -> tuple[int, list]:
    """Bytes the compiled layer saves for backward (parameters excluded), and the gradients of its
    input and trained weights, with the partitioner under `budget`."""
    torch._dynamo.reset()  # a fresh trace: dynamo would reuse the other budget's graph for a copy of the layer
    layer = copy.deepcopy(layer)
    layer.compile()
    saved = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter):
            saved.append(tensor.numel() * tensor.element_size())
        return tensor

    x = x.detach().requires_grad_()
    with torch._functorch.config.patch(**compile_settings(budget, x.device)):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = layer(x, position_embeddings=embeddings)
        (out[0] if isinstance(out, tuple) else out).square().mean().backward()
    return sum(saved), [x.grad, *(p.grad for p in layer.parameters() if p.requires_grad)]


@pytest.mark.cli  # torch.compile runs the C++ compiler
def test_lower_budget_saves_less_and_computes_the_same_gradients():
    decoder = tiny_lora_decoder("peft=lora")
    x = torch.randn(1, 256, decoder.config.hidden_size)
    embeddings = decoder.rotary_emb(x, torch.arange(256)[None])
    full_bytes, full_grads = saved_bytes_and_grads(decoder.layers[0], 1.0, x, embeddings)
    half_bytes, half_grads = saved_bytes_and_grads(decoder.layers[0], 0.5, x, embeddings)
    print(f"saved for backward: budget 1.0 {full_bytes / 2**20:.2f} MiB, budget 0.5 {half_bytes / 2**20:.2f} MiB")
    assert half_bytes <= 0.6 * full_bytes
    for ours, theirs in zip(half_grads, full_grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
