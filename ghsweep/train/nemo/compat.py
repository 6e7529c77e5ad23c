"""What NeMo 2.7.3 needs on a stack it was not released for: no Transformer Engine (Megatron's
local layers), and transformers 5.

NeMo's Llama defaults assume Transformer Engine (its layer spec, its fused rope). `use_local_spec`
switches a model config to Megatron's local layers with PyTorch attention (the recipe applies it).

NeMo 2.7.3's LoRA then asks two questions of every layer it matches, and both go wrong without
Transformer Engine (`allow_lora_without_te`):

- `LoRA.transform` (nemo/collections/llm/peft/lora.py) compares `m.__class__ == te.Linear`.
  Megatron's local layers are not `nn.Linear`, so the comparison is reached, and `te` is NeMo's
  placeholder, whose every attribute raises `UnavailableError`.
- `get_adapter_attributes_from_linear` (nemo/collections/llm/peft/utils.py) trusts its `HAVE_TE`,
  which is true whenever `megatron.core.extensions.transformer_engine` imports; without the package
  that module still imports, with placeholders for the TE layers, so `isinstance` gets a non-type.

Both only ask whether a layer is a Transformer Engine layer; where that package is missing the
answer is no, and NeMo's own branch for Megatron's Column/RowParallelLinear takes over.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def use_local_spec(config: Any) -> None:
    """Megatron's layers without Transformer Engine: PyTorch attention, and no fusion that needs TE or apex."""
    from ghsweep.train.nemo.torch_core_attention import local_layer_spec

    config.transformer_layer_spec = local_layer_spec
    config.apply_rope_fusion = False
    config.gradient_accumulation_fusion = False
    config.persist_layer_norm = False
    config.masked_softmax_fusion = False


class _AbsentTELinear:
    """Stands for `transformer_engine.pytorch.Linear` where it is not installed: no layer is one."""


def allow_lora_without_te() -> None:
    """Let NeMo's LoRA wrap Megatron's local layers; call only where Transformer Engine is missing."""
    from nemo.collections.llm.peft import lora, utils

    lora.te = SimpleNamespace(Linear=_AbsentTELinear)
    lora.HAVE_TE = False
    utils.HAVE_TE = False


def track_nemo_auto_tokenizer() -> None:
    """Make NeMo's AutoTokenizer serialisable into a NeMo checkpoint's context, as NeMo 2.7.3 does
    under transformers 4 (a no-op there).

    nemo/lightning/io/registry.py registers it (`track_io`) in one block with transformers' Llama
    tokenizer classes, importing `transformers.models.llama.tokenization_llama_fast`, which
    transformers 5 no longer has: the block is skipped whole, and saving a model whose tokenizer is
    NeMo's AutoTokenizer (any `model.path` run) fails with `UnserializableValueError`. Call before
    the first tokenizer is built: `track_io` wraps the class's `__init__` to record its arguments.
    """
    from nemo.collections.common.tokenizers import AutoTokenizer
    from nemo.lightning.io.artifact import DirOrStringArtifact, FileArtifact
    from nemo.lightning.io.mixin import track_io

    if hasattr(AutoTokenizer, "__io_artifacts__"):  # tracked already: transformers 4, or an earlier call
        return
    # NeMo's own registration (registry.py).
    track_io(
        AutoTokenizer,
        artifacts=[
            FileArtifact("vocab_file", required=False),
            FileArtifact("merges_file", required=False),
            DirOrStringArtifact("pretrained_model_name", required=False),
        ],
    )
