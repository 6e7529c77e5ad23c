"""The LoRA wrap of a built model (model.apply_peft) and its warm-up in the pre-imported worker."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ghsweep.train.model import apply_peft, build_model, warm_peft
from ghsweep.train.tokenizer import load_tokenizer
from tests.support.compose import compose_typed


class DevicesOfOps(TorchDispatchMode):
    """Within: the device types of the tensors (scalars aside) every op reads or writes, per op."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, set[str]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor) and t.dim()]
        self.ops.setdefault(str(func), set()).update(t.device.type for t in tensors)
        return out

    def on(self, device_type: str) -> list[str]:
        return sorted(op for op, devices in self.ops.items() if device_type in devices)


def test_lora_adapters_are_made_and_initialised_where_the_model_is_not_on_the_host():
    config = compose_typed("model=tiny_llama")
    model, _ = build_model(config.model, load_tokenizer(config), torch.device("meta"), torch.bfloat16)
    with DevicesOfOps() as seen:
        wrapped = apply_peft(model, config.peft, torch.bfloat16)
    adapters = [p for name, p in wrapped.named_parameters() if "lora_" in name]
    assert adapters and all(p.device.type == "meta" for p in adapters)
    # The adapters' initialisation ran on the model's device: no tensor was made or filled on the host.
    assert "aten.uniform_.default" in seen.ops
    assert seen.on("cpu") == []


def test_the_warm_up_wraps_a_model_that_allocates_nothing():
    with DevicesOfOps() as seen:
        warm_peft()
    assert seen.ops and seen.on("cpu") == []
    assert not torch.cuda.is_initialized()
