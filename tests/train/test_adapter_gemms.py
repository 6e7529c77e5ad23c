"""peft.adapter_gemms=grouped: LoRA's A GEMMs of one input as one GEMM in the compiled layers
(ghsweep/train/adapter_gemms.py). Which graphs it changes, and that they compute what peft's do."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx, nn

from ghsweep.train import adapter_gemms
from ghsweep.train.adapter_gemms import LINEAR, group_adapter_gemms
from ghsweep.train.torch_train import adapter_gemms_grouped
from tests.support.compose import compose_typed
from tests.support.models import tiny_lora_decoder


def layer_inputs(decoder: nn.Module) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    x = torch.randn(1, 64, decoder.config.hidden_size)
    return x, decoder.rotary_emb(x, torch.arange(64)[None])


def dynamo_graph(layer: nn.Module, x: torch.Tensor, embeddings) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """The graph torch.compile hands Inductor for `layer` (what its pre-grad passes see), and its inputs."""
    torch._dynamo.reset()
    captured: list[tuple[fx.GraphModule, list[torch.Tensor]]] = []

    def backend(graph_module: fx.GraphModule, inputs: list[torch.Tensor]):
        captured.append((graph_module, inputs))
        return graph_module.forward

    torch.compile(layer, backend=backend, fullgraph=True)(x, position_embeddings=embeddings)
    (graph, inputs), *_ = captured
    return graph, inputs


def linear_weights(graph: fx.GraphModule) -> list[tuple[int, ...]]:
    return sorted(
        tuple(node.args[1].meta["example_value"].shape)
        for node in graph.graph.nodes
        if node.op == "call_function" and node.target in LINEAR
    )


def test_the_a_gemms_of_one_input_become_one_that_computes_the_same():
    decoder = tiny_lora_decoder("peft=lora")
    x, embeddings = layer_inputs(decoder)
    graph, inputs = dynamo_graph(decoder.layers[0], x, embeddings)
    before = linear_weights(graph)
    expected = graph(*inputs)

    # q, k and v's A read the normalised input, gate and up's the next: two groups; o and down stay apart.
    assert group_adapter_gemms(graph.graph) == 2
    graph.recompile()
    after = linear_weights(graph)
    assert len(before) == 21 and len(after) == 18  # 7 base, 7 A and 7 B GEMMs; then 5 A's as 2
    assert (48, 256) in after and (32, 256) in after  # the stacked A's of q, k, v and of gate, up
    assert [shape for shape in before if shape[0] != 16] == [shape for shape in after if shape[0] not in (16, 32, 48)]

    got = graph(*inputs)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    trained = [tensor for tensor in inputs if isinstance(tensor, nn.Parameter) and tensor.requires_grad]
    assert len(trained) == 14
    for ours, theirs in zip(
        torch.autograd.grad(got[0].square().sum(), trained),
        torch.autograd.grad(expected[0].square().sum(), trained),
    ):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["peft=lora", "peft.dropout=0.1"], "each adapter drops its own copy of the input"),
        (["peft=lora", "peft.r=32"], "an A of 32 rows over 256 features is not thin"),
        (["peft=none"], "full weights: GEMMs bound by arithmetic, a copy each step if stacked"),
        (["peft=lora", "peft.target_modules=[q_proj,o_proj,gate_proj]"], "no two adapters share an input"),
    ],
)
def test_nothing_is_grouped_where_no_two_thin_trained_weights_share_an_input(overrides, why):
    decoder = tiny_lora_decoder(*overrides)
    graph, _ = dynamo_graph(decoder.layers[0], *layer_inputs(decoder))
    before = linear_weights(graph)
    assert group_adapter_gemms(graph.graph) == 0, why
    assert linear_weights(graph) == before


@pytest.mark.cli  # torch.compile runs the C++ compiler
def test_compiled_layers_train_the_same_with_grouped_and_separate_adapter_gemms(monkeypatch):
    """The pass as training sets it (adapter_gemms_grouped), through Inductor: the same outputs and
    gradients as peft's separate GEMMs; with separate, the pass is not set. The layers compile under
    saved-tensor hooks that read each saved tensor's storage, as activation offload's do (offload=on):
    the pass must not hand them its fake tensors."""
    saved_storages: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved_storages.append(tensor.untyped_storage().data_ptr())
        return tensor

    groups_made: list[int] = []

    def counted(graph: fx.Graph) -> int:
        groups_made.append(group_adapter_gemms(graph))
        return groups_made[-1]

    monkeypatch.setattr(adapter_gemms, "group_adapter_gemms", counted)
    # Compiled here, not loaded from an earlier test's caches (which skip the pre-grad passes).
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    config = compose_typed("model=tiny_llama", "peft=lora")
    decoder = tiny_lora_decoder("peft=lora")
    x, embeddings = layer_inputs(decoder)
    results = {}
    for choice in ("grouped", "separate"):
        torch._dynamo.reset()
        layer = copy.deepcopy(decoder.layers[0])
        layer.compile()
        peft = copy.deepcopy(config.peft)
        peft.adapter_gemms = choice
        with adapter_gemms_grouped(peft, compiled=True):
            assert (torch._inductor.config.pre_grad_custom_pass is not None) == (choice == "grouped")
            xi = x.clone().requires_grad_()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                out = layer(xi, position_embeddings=embeddings)
            out = out[0] if isinstance(out, tuple) else out
            out.square().mean().backward()
        results[choice] = [out.detach(), xi.grad, *(p.grad for p in layer.parameters() if p.requires_grad)]
    assert torch._inductor.config.pre_grad_custom_pass is None  # set only while training
    assert groups_made == [2]  # Inductor ran the pass on the grouped layer's graph, and only there
    assert saved_storages  # the hooks saw the compiled layers' saved tensors
    for grouped, separate in zip(results["grouped"], results["separate"]):
        torch.testing.assert_close(grouped, separate, rtol=1e-5, atol=1e-6)
