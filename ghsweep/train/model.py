"""Build the model a run trains: a local Hugging Face folder, or random init from config."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from ghsweep.config.schema import ModelSchema, PeftSchema, carried
from ghsweep.train.flops import ModelShape

if TYPE_CHECKING:
    from peft import LoraConfig


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(
    model_config: ModelSchema,
    tokenizer: Any,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str = "sdpa",
) -> tuple[torch.nn.Module, bool]:
    """Return (model, random_init), the model's weights in `dtype` on `device`, its attention computed by
    transformers' `attn_implementation` (sdpa, flex_attention).

    With `model.path` the weights come from that folder (safetensors, as saved by `save_pretrained`);
    otherwise the model is randomly initialised from the shape in the config, directly on the device (a 7B
    model initialised on the CPU takes minutes), its special tokens `tokenizer`'s (tokenizer.load_tokenizer).
    """
    if model_config.path:
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
            Path(model_config.path), attn_implementation=attn_implementation, dtype=dtype, device_map=device
        )
        return model, False
    hf_config = llama_config(
        ModelShape.of_model(model_config),
        model_config.max_position_embeddings,
        attn_implementation,
        rms_norm_eps=model_config.rms_norm_eps,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.device(device), _default_dtype(dtype):
        model = LlamaForCausalLM(hf_config)
    return model, True


def llama_config(shape: ModelShape, max_position_embeddings: int, attn_implementation: str, **more: Any) -> LlamaConfig:
    """transformers' config of a Llama model of `shape` to train (no KV cache), its attention computed by
    `attn_implementation` (sdpa, flex_attention); `more`: other LlamaConfig fields."""
    return LlamaConfig(
        **shape.hf_fields(),
        max_position_embeddings=max_position_embeddings,
        use_cache=False,
        # Accepted at run time (kept as _attn_implementation); transformers' annotated signature leaves it out.
        attn_implementation=attn_implementation,  # type: ignore[call-arg]
        **more,
    )


def apply_peft(model: torch.nn.Module, peft_config: PeftSchema, adapter_dtype: torch.dtype) -> torch.nn.Module:
    """Wrap the model in LoRA adapters (peft) in `adapter_dtype`, or leave every weight trainable."""
    if peft_config.name == "none":
        return model
    from peft import get_peft_model

    frozen = next(model.parameters())
    # The adapters are made and initialised where the model is, not on the host and then copied: on the
    # host their ~700 small initialisations each ran on every core, and beside the sweep's other work (the
    # last run's analysis, nsys) a 7B model's wrapping took 1.0-1.4 s of a run's set-up, against 0.5 s
    # alone (one H200 host, 16 cores). peft's default upcasts adapters of a bf16/fp16 base to fp32; keep
    # them in adapter_dtype.
    with torch.device(frozen.device):
        return get_peft_model(model, lora_config(peft_config), autocast_adapter_dtype=adapter_dtype != frozen.dtype)


def warm_peft() -> None:
    """Wrap a one-layer Llama on the meta device in LoRA, so that what transformers and peft build at
    their first wrap (transformers' weight-conversion patterns, hundreds of regular expressions) is built
    in this process: a worker forked from it later skips that work. On this project's CPU machine a
    32-layer model's wrap went from 0.9 s to 0.3 s after it; the warm-up itself takes 0.15 s. The meta
    device allocates nothing and runs no kernel, so the process touches neither CUDA nor its CPU threads."""
    from peft import LoraConfig, get_peft_model

    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(ModelShape(8, 8, 1, 1, 1, 8), 8, "sdpa"))
        get_peft_model(model, LoraConfig(r=1, target_modules=["q_proj"], task_type="CAUSAL_LM"))


def lora_config(peft_config: PeftSchema) -> LoraConfig:
    """peft's LoraConfig of peft=lora's knobs, for a causal language model."""
    from peft import LoraConfig

    return LoraConfig(
        r=carried(peft_config.r, "peft.r"),
        # peft scales by alpha / r, so any positive number works; its annotation says int.
        lora_alpha=carried(peft_config.alpha, "peft.alpha"),  # type: ignore[arg-type]
        lora_dropout=carried(peft_config.dropout, "peft.dropout"),
        target_modules=carried(peft_config.target_modules, "peft.target_modules"),
        task_type="CAUSAL_LM",
    )


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(total, trainable) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return total, trainable
