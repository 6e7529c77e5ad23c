"""peft.adapter_gemms=grouped (LoRA's A GEMMs of one input as one GEMM) and peft.adapter_scale=weight (the
scale on B, not on B's output) in the compiled layers (ghsweep/train/adapter_gemms.py). Which graphs they
change, and that they compute what peft's do."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx, nn

from ghsweep.train import adapter_gemms
from ghsweep.train.adapter_gemms import LINEAR, group_adapter_gemms, scale_adapter_weights
from ghsweep.train.torch_train import adapter_gemm_passes
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


def full_size_products_in_backward(graph: fx.GraphModule, inputs: list[torch.Tensor], scale: float) -> int:
    """Tensors of the layer's output size or more that autograd's backward graph of `graph` multiplies by
    `scale` (each a full-size tensor written in backward)."""
    from functorch.compile import aot_function, make_boxed_func

    full_size = graph(*inputs)[0].numel()
    counted: list[int] = []

    def backward_compiler(module: fx.GraphModule, _):
        products = [node for node in module.graph.nodes if node.target == torch.ops.aten.mul.Tensor]
        counted.append(sum(scale in node.args and node.meta["val"].numel() >= full_size for node in products))
        return make_boxed_func(module.forward)

    compiled = aot_function(
        graph.forward, fw_compiler=lambda module, _: make_boxed_func(module.forward), bw_compiler=backward_compiler
    )
    compiled(*inputs)[0].sum().backward()
    return counted[0]


@pytest.mark.parametrize("alpha", [32, 24])
def test_the_scale_on_b_computes_what_peft_s_scaled_output_does(alpha):
    # alpha 32 over r 16: a scale of 2, exact in floats, so the very same numbers; alpha 24: 1.5, rounded.
    decoder = tiny_lora_decoder("peft=lora", f"peft.alpha={alpha}")
    x, embeddings = layer_inputs(decoder)
    graph, inputs = dynamo_graph(decoder.layers[0], x, embeddings)
    scale = alpha / 16
    before = full_size_products_in_backward(graph, inputs, scale)
    expected = graph(*inputs)
    trained = [tensor for tensor in inputs if isinstance(tensor, nn.Parameter) and tensor.requires_grad]
    expected_grads = torch.autograd.grad(expected[0].square().sum(), trained)

    assert scale_adapter_weights(graph.graph) == 7  # one B a projection
    graph.recompile()
    assert len(linear_weights(graph)) == 21  # the same GEMMs, B's scaled first
    # Backward wrote B's output gradient times the scale, full size, for each of the 7; now for none.
    assert (before, full_size_products_in_backward(graph, inputs, scale)) == (7, 0)
    got = graph(*inputs)
    grads = torch.autograd.grad(got[0].square().sum(), trained)
    tolerance = {"rtol": 0, "atol": 0} if scale == 2 else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(got, expected, **tolerance)
    for ours, theirs in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(ours, theirs, **tolerance)


def test_full_weights_and_a_s_keep_their_products():
    # Full fine-tuning's weights are not thin, and an A's product is not B's output.
    decoder = tiny_lora_decoder("peft=none")
    graph, _ = dynamo_graph(decoder.layers[0], *layer_inputs(decoder))
    assert scale_adapter_weights(graph.graph) == 0


@pytest.mark.cli  # torch.compile runs the C++ compiler
def test_compiled_layers_train_the_same_with_each_adapter_gemm_pass(monkeypatch):
    """The passes as training sets them (adapter_gemm_passes), through Inductor: grouped A GEMMs, and with
    them the scale on B, give the same outputs and gradients as peft's GEMMs; with neither, no pass is
    set. The layers compile under saved-tensor hooks that read each saved tensor's storage, as
    activation offload's do (offload=on): the passes must not hand them their fake tensors."""
    saved_storages: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved_storages.append(tensor.untyped_storage().data_ptr())
        return tensor

    made: list[tuple[str, int]] = []

    def counted(name: str, graph_pass):
        def run(graph: fx.Graph) -> int:
            made.append((name, graph_pass(graph)))
            return made[-1][1]

        return run

    monkeypatch.setattr(adapter_gemms, "group_adapter_gemms", counted("grouped", group_adapter_gemms))
    monkeypatch.setattr(adapter_gemms, "scale_adapter_weights", counted("scaled", scale_adapter_weights))
    # Compiled here, not loaded from an earlier test's caches (which skip the pre-grad passes).
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    config = compose_typed("model=tiny_llama", "peft=lora")
    decoder = tiny_lora_decoder("peft=lora")
    x, embeddings = layer_inputs(decoder)
    results = {}
    for gemms, scale in (("grouped", "output"), ("grouped", "weight"), ("separate", "output")):
        torch._dynamo.reset()
        layer = copy.deepcopy(decoder.layers[0])
        layer.compile()
        peft = copy.deepcopy(config.peft)
        peft.adapter_gemms, peft.adapter_scale = gemms, scale
        with adapter_gemm_passes(peft, compiled=True):
            assert (torch._inductor.config.pre_grad_custom_pass is not None) == (gemms == "grouped")
            xi = x.clone().requires_grad_()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                out = layer(xi, position_embeddings=embeddings)
            out = out[0] if isinstance(out, tuple) else out
            out.square().mean().backward()
        results[gemms, scale] = [out.detach(), xi.grad, *(p.grad for p in layer.parameters() if p.requires_grad)]
    assert torch._inductor.config.pre_grad_custom_pass is None  # set only while training
    # Inductor ran the passes on the graphs that asked for them, and only there.
    assert made == [("grouped", 2), ("grouped", 2), ("scaled", 7)]
    assert saved_storages  # the hooks saw the compiled layers' saved tensors
    for changed in (("grouped", "output"), ("grouped", "weight")):
        for ours, peft_s in zip(results[changed], results["separate", "output"], strict=True):
            torch.testing.assert_close(ours, peft_s, rtol=1e-5, atol=1e-6)
