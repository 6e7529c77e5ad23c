"""LoRA's A GEMMs that read one input, run as one GEMM: a graph pass for torch.compile's layers.

peft computes each adapter apart. In a Llama block the A matrices (r x hidden) of q, k and v each
read the normalised hidden states, those of gate and up the next ones. Each such GEMM is thin: its
time is that of reading its input (4096 x 4096 in bf16, 32 MiB, about 10 us on an H200). Autograd
then gives each adapter its own A gradient (which reads the input again) and its own input gradient
(a full-size tensor written, then summed with the others). Stacked, the A's of one input make one
GEMM that reads the input once in forward and once in backward and writes one input gradient.

`AdapterGemmPasses` runs on each compiled graph before autograd's (torch._inductor.config's
pre_grad_custom_pass). Per input, it takes the linear calls without bias whose weight is trained and
has at most 1/16 as many rows as columns (LoRA's A; never a frozen weight nor a full one, whose GEMMs
are bound by arithmetic and whose concatenation would copy them each step) and puts in their place
linear(input, cat(A_1, ..., A_n)), split back into the n outputs. The parameters stay peft's: only
the compiled graph changes, so the optimizer, checkpoints and saved adapters see the same tensors.
Dropout (peft.dropout > 0) gives each adapter an input of its own, so nothing is grouped there.

peft scales B's output: `lora_B(lora_A(x)) * scaling`, a full-size product (tokens x output features).
Autograd then multiplies B's output gradient by the scale into a tensor of its own, which B's two
gradient GEMMs read: a full-size write a projection a step, where the scale could be applied to B (its
output features x r) instead. `scale_adapter_weights` makes that `lora_B`'s weight times the scale
(peft.adapter_scale=weight, the default): the same function, and the same products when the scale is a
power of two (alpha / r = 2 by default), as scaling a float by 2 is exact. The compiled kernels that sum
them differ (B times the scale is a tensor of its own), so a run is not bitwise the one with the scale on
the output: on one H100 over 200 steps of the 7B shape, mean loss difference 0.0012 in bf16, while LoRA
bf16's step took 3.1 ms less and fp8's 1.8 ms (benchmarks/h100_adapter_scale.json).
"""

from __future__ import annotations

import operator

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

LINEAR = (torch._C._nn.linear, torch.nn.functional.linear)
MULTIPLY = (operator.mul, torch.mul)
# A weight is thin, an adapter's A (B), with at most this share of its input (output) features as rows (columns).
THIN_RATIO = 16


def _trained_linear(node: fx.Node) -> tuple[fx.Node, fx.Node, int, int] | None:
    """(input, weight, its rows, its columns) of `node` if it is a linear call without bias on a trained
    2-D weight, else None."""
    if node.op != "call_function" or node.target not in LINEAR:
        return None
    args = list(node.args) + [None] * (3 - len(node.args))
    source, weight, bias = (node.kwargs.get(name, arg) for name, arg in zip(("input", "weight", "bias"), args))
    if bias is not None or not isinstance(source, fx.Node) or not isinstance(weight, fx.Node):
        return None
    value = weight.meta.get("example_value")
    if not isinstance(value, torch.Tensor) or value.dim() != 2 or not value.requires_grad:
        return None
    rows, columns = value.shape
    return source, weight, rows, columns


def _thin_trained_linear(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(input, weight) of `node` if it is a linear call without bias on a trained A-like weight, else None."""
    found = _trained_linear(node)
    if found is None:
        return None
    source, weight, rows, columns = found
    return (source, weight) if rows * THIN_RATIO <= columns else None


def group_adapter_gemms(graph: fx.Graph) -> int:
    """Put one GEMM in place of the thin trained linears of each input in `graph`; the groups made."""
    order = {node: index for index, node in enumerate(graph.nodes)}
    by_input: dict[fx.Node, list[tuple[fx.Node, fx.Node]]] = {}
    for node in graph.nodes:
        operands = _thin_trained_linear(node)
        if operands is not None:
            source, weight = operands
            by_input.setdefault(source, []).append((node, weight))
    groups = 0
    for source, linears in by_input.items():
        first = linears[0][0]
        weights = [weight for _, weight in linears]
        # The stacked GEMM takes the first one's place: every weight must be defined by then.
        if (
            len(linears) < 2
            or any(order[weight] > order[first] for weight in weights)
            or not isinstance(source.meta.get("example_value"), torch.Tensor)
        ):
            continue
        values = [weight.meta["example_value"] for weight in weights]
        rows = [value.shape[0] for value in values]
        # Later passes read each node's example value (fake tensors): the new nodes get theirs too. Made
        # without autograd: it would hand these fake tensors to the run's saved-tensor hooks, which the
        # compile runs under (activation offload's read their storage).
        with torch.no_grad():
            stacked_value = torch.cat(values, dim=0)
            fused_value = torch._C._nn.linear(source.meta["example_value"], stacked_value)
            parts_value = torch.split(fused_value, rows, -1)
        with graph.inserting_before(first):
            stacked = graph.call_function(torch.cat, (weights,), {"dim": 0})
            fused = graph.call_function(torch._C._nn.linear, (source, stacked))
            parts = graph.call_function(torch.split, (fused, rows), {"dim": -1})
            stacked.meta["example_value"], fused.meta["example_value"] = stacked_value, fused_value
            parts.meta["example_value"] = parts_value
            for index, (linear, _) in enumerate(linears):
                part = graph.call_function(operator.getitem, (parts, index))
                part.meta["example_value"] = parts_value[index]
                linear.replace_all_uses_with(part)
        for linear, _ in linears:
            graph.erase_node(linear)
        groups += 1
    return groups


def scale_adapter_weights(graph: fx.Graph) -> int:
    """Put `linear(t, B * s)` in place of `linear(t, B) * s` in `graph`, where B is a trained weight with
    at most 1/THIN_RATIO as many columns as rows (LoRA's B) and s a number; the products moved."""
    moved = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in MULTIPLY or len(node.args) != 2 or node.kwargs:
            continue
        for product, scale in (node.args, node.args[::-1]):
            found = _trained_linear(product) if isinstance(product, fx.Node) else None
            if found is None or not isinstance(scale, (int, float)) or len(product.users) != 1:
                continue
            _, weight, rows, columns = found
            if columns * THIN_RATIO > rows:
                continue
            with graph.inserting_before(product):
                scaled = graph.call_function(operator.mul, (weight, scale))
            # Made without autograd, as group_adapter_gemms's values.
            with torch.no_grad():
                scaled.meta["example_value"] = weight.meta["example_value"] * scale
            product.replace_input_with(weight, scaled)
            node.replace_all_uses_with(product)
            graph.erase_node(node)
            moved += 1
            break
    return moved


class AdapterGemmPasses(CustomGraphPass):
    """group_adapter_gemms (`group`) and scale_adapter_weights (`scale_weights`) as torch.compile's
    pre-grad pass; its cache key is this file's text and the two choices, so a compiled graph is reused
    only by the same passes."""

    def __init__(self, group: bool, scale_weights: bool):
        self.group, self.scale_weights = group, scale_weights

    def __call__(self, graph: fx.Graph) -> None:
        if self.group:
            group_adapter_gemms(graph)
        if self.scale_weights:
            scale_adapter_weights(graph)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,)) + f"group={self.group},scale_weights={self.scale_weights}".encode()
