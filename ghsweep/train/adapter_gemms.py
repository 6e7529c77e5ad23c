"""LoRA's A GEMMs that read one input, run as one GEMM: a graph pass for torch.compile's layers.

peft computes each adapter apart. In a Llama block the A matrices (r x hidden) of q, k and v each
read the normalised hidden states, those of gate and up the next ones. Each such GEMM is thin: its
time is that of reading its input (4096 x 4096 in bf16, 32 MiB, about 10 us on an H200). Autograd
then gives each adapter its own A gradient (which reads the input again) and its own input gradient
(a full-size tensor written, then summed with the others). Stacked, the A's of one input make one
GEMM that reads the input once in forward and once in backward and writes one input gradient.

`GroupAdapterGemms` runs on each compiled graph before autograd's (torch._inductor.config's
pre_grad_custom_pass). Per input, it takes the linear calls without bias whose weight is trained and
has at most 1/16 as many rows as columns (LoRA's A; never a frozen weight nor a full one, whose GEMMs
are bound by arithmetic and whose concatenation would copy them each step) and puts in their place
linear(input, cat(A_1, ..., A_n)), split back into the n outputs. The parameters stay peft's: only
the compiled graph changes, so the optimizer, checkpoints and saved adapters see the same tensors.
Dropout (peft.dropout > 0) gives each adapter an input of its own, so nothing is grouped there.
"""

from __future__ import annotations

import operator

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

LINEAR = (torch._C._nn.linear, torch.nn.functional.linear)
# A weight is thin (an adapter's A) with at most this share of its input features as rows.
THIN_RATIO = 16


def _thin_trained_linear(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(input, weight) of `node` if it is a linear call without bias on a trained, thin weight, else None."""
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


class GroupAdapterGemms(CustomGraphPass):
    """group_adapter_gemms as torch.compile's pre-grad pass; its cache key is this file's text, so a
    compiled graph is reused only by the same pass."""

    def __call__(self, graph: fx.Graph) -> None:
        group_adapter_gemms(graph)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))
